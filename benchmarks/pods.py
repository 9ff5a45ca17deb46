"""The real-size recipes on TPU slices, on paper: `rj.plan` for each recipe x target, as the table
of docs/pods.md (memory per chip, predicted iteration, model FLOPs utilisation, fits).

    python benchmarks/pods.py                         # the default grid (about 4 min a plan here)
    python benchmarks/pods.py --recipes grpo_qwen2.5_7b --targets v5e:4x4 v5e:2x2
    python benchmarks/pods.py --recipes ppo_pi0 ppo_openvla_7b --targets v5p:2x2x2

Each row is one plan in this process: XLA's TPU compiler (libtpu) on abstract chips, no
weights. A language model's micro-batch follows the slice (``actor.micro_batch_size`` = the
chips, so that every chip takes one row of it under FSDP) unless ``--micro`` fixes it. The last line is
the JSON of every row.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import rlinf_jax as rj
from rlinf_jax.errors import BadInput
from rlinf_jax.sharding.targets import GIB, parse_target

RECIPES = ("grpo_qwen2.5_1.5b", "grpo_qwen2.5_7b")
TARGETS = ("v5e:2x4", "v5e:4x4", "v5e:8x8", "v5p:2x2x2", "v6e:2x4")


def row(recipe: str, target: str, extra: list[str], micro: int | None) -> dict:
    chips = parse_target(target).chips
    # A language model's micro-batch follows the slice; an embodied run's minibatches are its own.
    lm = rj.load_config(recipe).runner.task in ("reasoning", "sft")
    overrides = [*([f"actor.micro_batch_size={micro or chips}"] if lm else []), *extra]
    t0 = time.perf_counter()
    try:
        report = rj.plan(recipe, target, overrides)
    except BadInput as e:
        return {"recipe": recipe, "target": target, "overrides": overrides, "error": str(e)}
    out = report.to_json()
    worst = report.largest
    return {
        "recipe": recipe, "target": target, "chips": chips, "overrides": overrides,
        "fits": out["fits"], "peak_per_chip_gib": out["peak_per_chip_gib"], "hbm_per_chip_gib": out["hbm_per_chip_gib"],
        "largest_program": f"{worst.component}/{worst.name}",
        "predicted_iteration_s": out["predicted_iteration_s"], "predicted_mfu": out["predicted_mfu"],
        "programs": {f"{r.component}/{r.name}": round(r.peak_bytes / GIB, 2) for r in report.reports},
        "plan_s": round(time.perf_counter() - t0, 1),
    }


def table(rows: list[dict]) -> str:
    lines = ["| recipe | target | fits | peak GiB/chip (largest program) | predicted s/iteration | MFU bound |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['recipe']} | {r['target']} | - | {r['error']} | - | - |")
            continue
        t = "refused" if r["predicted_iteration_s"] is None else f"{r['predicted_iteration_s']:.1f}"
        mfu = "-" if r["predicted_mfu"] is None else f"{r['predicted_mfu']:.0%}"
        lines.append(f"| {r['recipe']} | {r['target']} | {'yes' if r['fits'] else 'no'} | "
                     f"{r['peak_per_chip_gib']:.2f} of {r['hbm_per_chip_gib']:g} ({r['largest_program']}) | {t} | {mfu} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES))
    parser.add_argument("--targets", nargs="+", default=list(TARGETS))
    parser.add_argument("--micro", type=int, default=None, help="actor.micro_batch_size (default: the chips)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    rows = []
    for recipe in args.recipes:
        for target in args.targets:
            rows.append(row(recipe, target, args.overrides, args.micro))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
