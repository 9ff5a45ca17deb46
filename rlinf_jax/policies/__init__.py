"""Policies: Flax NNX models (``mlp`` for control, ``lm`` for language models, ``vla`` for
vision-language-action models) and the adapters the embodied trainer drives (``embodied``)."""
