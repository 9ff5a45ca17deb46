"""Vision-language-action policies: the vision towers (``vit``), OpenVLA (``openvla``,
``action_tokens``), OpenVLA-OFT parallel decoding (``oft``) and their heads (``heads``)."""
