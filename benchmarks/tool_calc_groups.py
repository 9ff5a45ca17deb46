#!/usr/bin/env python
"""How much GRPO signal a calculator-recipe checkpoint gives: held-out problems answered by
whole episodes, greedy once and ``--n`` times sampled at ``--temperature``, per level.

A GRPO group whose ``n`` episodes all score the same has a zero advantage and adds no
gradient; a level with pass@n = 0 cannot be learnt by GRPO from that checkpoint at all.
Printed per level: greedy accuracy, sampled accuracy, pass@n and the fraction of uniform
groups. The last line of stdout is one JSON object with the same numbers.

    python benchmarks/tool_calc_groups.py RUN_OR_CHECKPOINT [--n 8] [--temperature 1.0] [key=value ...]

The overrides are those of the recipe (``grpo_tool_calc``), e.g. ``data.eval_size=128``.
"""

from __future__ import annotations

import argparse
import json
import sys


def _parse(argv):
    p = argparse.ArgumentParser(prog="benchmarks/tool_calc_groups.py", description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="an sft / reasoning run folder or checkpoint of the calculator recipe")
    p.add_argument("--n", type=int, default=8, help="sampled episodes per problem (a GRPO group; default 8)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("overrides", nargs="*", metavar="key=value")
    return p.parse_args(argv)


def _per_level(values, levels, fn) -> dict:
    return {f"level{k}": round(float(fn(values[levels == k])), 4) for k in sorted(set(levels.tolist()))}


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.n < 2 or args.temperature <= 0:
        print("error: --n must be >= 2 and --temperature > 0 (a group of sampled episodes)", file=sys.stderr)
        return 2
    from rlinf_jax.api import load_config, prepare_jax
    from rlinf_jax.errors import BadInput

    prepare_jax("grpo_tool_calc", args.overrides)
    import jax
    import numpy as np

    from rlinf_jax.tasks.reasoning.trainer import ReasoningTrainer

    try:
        cfg = load_config("grpo_tool_calc", [f"actor.model.path={args.checkpoint}", "agent.num_workers=0",
                                             "sft.warm_start_steps=0", *args.overrides])
        trainer = ReasoningTrainer(cfg)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    trainer.init()
    col, ds = trainer.collector, trainer.lm.eval_ds
    recs = [ds[i] for i in range(len(ds))]
    levels = np.array([r.get("level", 0) for r in recs])
    key = jax.random.PRNGKey(args.seed)
    greedy, _ = col.episodes(recs, key, 0.0, np.arange(len(recs), dtype=np.uint32))
    rows = [r for r in recs for _ in range(args.n)]
    sampled, _ = col.episodes(rows, jax.random.fold_in(key, 1), args.temperature, np.arange(len(rows), dtype=np.uint32))
    groups = sampled.rewards.reshape(len(recs), args.n)
    uniform = groups.max(axis=1) == groups.min(axis=1)
    out = {
        "problems": len(recs), "n": args.n, "temperature": args.temperature,
        "greedy_accuracy": round(float(greedy.rewards.mean()), 4),
        "greedy_by_level": _per_level(greedy.rewards, levels, np.mean),
        "sampled_accuracy": round(float(groups.mean()), 4),
        "sampled_by_level": _per_level(groups, levels, np.mean),
        f"pass@{args.n}_by_level": _per_level(groups.max(axis=1), levels, np.mean),
        "uniform_groups": round(float(uniform.mean()), 4),
        "uniform_groups_by_level": _per_level(uniform, levels, np.mean),
    }
    trainer.close()
    for k, v in out.items():
        print(f"{k:>24}: {v}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
