"""`python -m rlinf_jax.convert --from HF_DIR --to OUT_DIR`: torch / Hugging Face weights -> Flax.

Reads a local checkpoint directory (``config.json`` + safetensors, single file or sharded)
of any family in ``rlinf_jax.policies.convert.REGISTRY``, picked by its ``model_type``:
language models (Llama, Qwen2, Qwen3, Gemma), vision towers (SigLIP, DINOv2 with
registers), OpenVLA, PaliGemma and pi0. Every tensor is checked against the architecture
and the parameters are written as an Orbax checkpoint with a copy of ``config.json`` (and
the tokenizer files, when present). A trainer starts from the result with
``actor.model.path=OUT_DIR``; ``rlinf_jax.policies.convert.load_converted`` reads it back.
Prints one JSON line describing what was written.
"""

from __future__ import annotations

import argparse
import json
import sys



def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m rlinf_jax.convert", description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="src", required=True, metavar="HF_DIR", help="local Hugging Face model directory")
    parser.add_argument("--to", dest="out", required=True, metavar="OUT_DIR", help="new (or empty) output directory")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="dtype of the stored parameters (auto: the checkpoint's own, per config.json)",
    )
    parser.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="convert weights that hold NaN or inf (refused by default: such a model cannot train)",
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    from rlinf_jax.api import convert
    from rlinf_jax.errors import BadInput

    try:
        summary = convert(args.src, args.out, dtype=args.dtype, allow_nonfinite=args.allow_nonfinite)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from rlinf_jax.crash import report_crash

        return report_crash(e)
    print(json.dumps(summary))
    return 0
