"""`python -m rlinf_jax.plan --config-name RECIPE --target TOPOLOGY [key=value ...]`: a run on
paper, before it is launched.

Every program of one iteration (the rollout's prefill and decode loop, the reference
model's log-probs, the actor's update) is built from abstract shapes, laid out with the
recipe's placement and meshes on the target's chips and compiled by the target's own
compiler (libtpu, the ``tpu`` extra; no TPU needed, no weights read). Prints, per program,
what each chip holds (arguments, outputs, temporaries, other components' state), its FLOPs
and bytes, and a roofline bound of its time; then the predicted iteration time and model
FLOPs utilisation, one verdict line (fits, or does not fit with the largest program named),
and last a JSON object of all of it.

Exit codes: 0 fits, 1 does not fit, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys



def _parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m rlinf_jax.plan", description="A run on paper, before it is launched: every program of an iteration compiled for a TPU "
        "topology (no TPU, no weights), the memory each chip holds, a roofline bound of the time, and whether it fits.",
        epilog="Targets: a TPU generation and its chip grid: v5e:2x2, v5e:4x4 (16 chips, 4 hosts), v5e:8x8, "
        "v5p:2x2x2, v6e:2x4, v4:2x2x2; or GPUs and how many: h100x8, a100x8, h200x16 (an estimate from XLA's CPU "
        "compiler, which the plan says). Example: python -m rlinf_jax.plan --config-name grpo_qwen2.5_7b "
        "--target v5e:4x4",
    )
    parser.add_argument("--config-name", "-cn", required=True, help="recipe in configs/ (or a .yaml path)")
    parser.add_argument("--target", required=True, help="the TPU topology or GPUs to plan for, e.g. v5e:4x4 or h100x8")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--hbm-gib", type=float, default=None,
                        help="plan against this much memory per chip (default: the chip's own)")
    parser.add_argument(
        "--remedies", action="store_true",
        help="when the run does not fit, plan it again with each memory remedy (chunked log-probs, "
        "rematerialisation, smaller micro-batches, LoRA, QLoRA) and all of them together, and say which fit",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser.parse_intermixed_args(argv)


def main(argv=None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    from rlinf_jax.accelerators import host_devices_for_target

    host_devices_for_target(args.target)  # a GPU target's stand-ins, before JAX starts
    # Deferred until the arguments are parsed, so that `--help` answers before JAX loads.
    from rlinf_jax.api import plan
    from rlinf_jax.errors import BadInput

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    try:
        report = plan(args.config_name, args.target, args.overrides, progress=progress, remedies=args.remedies,
                      hbm_gib=args.hbm_gib)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from rlinf_jax.crash import report_crash

        return report_crash(e)
    print(report.table())
    print(report.verdict())
    print(json.dumps(report.to_json()))
    return 0 if report.fits else 1
