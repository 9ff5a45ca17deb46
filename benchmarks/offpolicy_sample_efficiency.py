#!/usr/bin/env python
"""Sample efficiency of the off-policy family: env steps until the greedy policy's
evaluation return first reaches ``--threshold``, per algorithm and seed, on one env and
one budget.

Algorithms (all on the ``sac_brax`` recipe's env batch, update-to-data ratio and batch
size unless said otherwise, each with its own published choices on top):

* ``sac``: the ``sac_brax`` recipe;
* ``crossq``: ``crossq_brax`` (batch renormalisation, no target network, actor every 3
  critic steps, Adam lr 1e-3 / b1 0.5) on SAC's schedule, with critics ``--crossq-width``
  wide (the paper's 2048 and one update per transition take hours per seed on a 2-core
  CPU; say so when quoting);
* ``sac_ensemble``: SAC with RLPD's critics (LayerNorm, 10 critics, target minimum over 2
  drawn at random, the actor on their mean) and no demonstrations: RLPD's ablation;
* ``rlpd``: the same with half of every batch drawn from demonstrations.

The demonstrations are the transitions of a PPO policy trained here first (the default
``ppo_brax`` recipe, then ``python -m rlinf_jax.collect``), or ``--demos FILE``.

The last line of stdout is one JSON object: per algorithm the env steps to threshold of
every seed (``null``: not within ``--max-iterations``), their median, and the medians'
ratios to SAC (lower is more sample-efficient).

    python benchmarks/offpolicy_sample_efficiency.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ALGORITHMS = ("sac", "crossq", "sac_ensemble", "rlpd")
ENSEMBLE = ["algorithm.offpolicy.num_q=10", "algorithm.offpolicy.num_min_q=2", "algorithm.offpolicy.actor_q_reduce=mean", "algorithm.offpolicy.critic_norm=layer",
            "algorithm.offpolicy.target_entropy_per_dim=-0.5"]


def log(msg: str) -> None:
    print(msg, flush=True)


def overrides(name: str, args, demos: str) -> tuple[str, list[str]]:
    common = [f"env.num_eval_envs={args.eval_envs}"]
    if name == "sac":
        return "sac_brax", common
    # The SAC recipe's schedule, so that only the algorithms differ (crossq_brax and
    # rlpd_brax are scheduled for a GPU / for fewer envs).
    schedule = ["algorithm.rollout_length=10", "algorithm.offpolicy.utd_ratio=32", "algorithm.offpolicy.batch_size=64",
                "algorithm.offpolicy.replay_size=16384", "algorithm.offpolicy.learning_starts=512", "algorithm.gamma=0.97",
                "algorithm.reward_scale=10.0", "algorithm.normalize_observations=true", "env.num_envs=64"]
    if name == "crossq":
        w = args.crossq_width
        return "crossq_brax", [*common, *schedule, f"actor.model.value_hidden_sizes=[{w},{w}]"]
    if name == "sac_ensemble":
        return "sac_brax", [*common, *ENSEMBLE]
    return "rlpd_brax", [*common, *schedule, f"algorithm.offpolicy.demo_path={demos}"]


def run_one(name: str, seed: int, args, demos: str) -> dict:
    import jax

    from rlinf_jax.tasks.offpolicy.run import build_trainer
    from rlinf_jax.tasks.registry import load_run_config

    recipe, extra = overrides(name, args, demos)
    cfg = load_run_config(recipe, [*extra, f"runner.seed={seed}", "runner.progress_bar=false"])
    t0 = time.perf_counter()
    trainer = build_trainer(cfg)
    ts = trainer.init()
    key = jax.random.PRNGKey(seed + 1)
    trainer.compile(ts, key)
    curve, reached = [], None
    for it in range(args.eval_every, args.max_iterations + 1, args.eval_every):
        ts, sums = trainer.run_iterations(ts, args.eval_every)
        trainer.summarize(sums, args.eval_every)
        ret = float(trainer.run_eval(ts, jax.random.fold_in(key, it))["eval/return"])
        steps = it * trainer.env_steps_per_iteration
        curve.append([steps, round(ret, 1)])
        if ret >= args.threshold:
            reached = steps
            break
    wall = time.perf_counter() - t0
    log(f"[{name} seed {seed}] env steps to {args.threshold:g}: {reached} | wall {wall:.0f} s | curve {curve}")
    return {"env_steps_to_threshold": reached, "wall_s": round(wall, 1), "curve": curve}


def make_demos(args, out_dir: str) -> str:
    from rlinf_jax import collect
    from rlinf_jax.cli.train import main as train

    log("training the PPO policy whose transitions are the demonstrations (default ppo_brax recipe)")
    assert train([f"runner.output_dir={out_dir}", "runner.experiment_name=ppo", "runner.progress_bar=false"]) == 0
    path = os.path.join(out_dir, "demos.parquet")
    assert collect.main([os.path.join(out_dir, "ppo"), "--transitions", str(args.demo_transitions), "--out", path]) == 0
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threshold", type=float, default=900.0)
    p.add_argument("--eval-every", type=int, default=5, help="iterations between evaluations")
    p.add_argument("--max-iterations", type=int, default=100)
    p.add_argument("--eval-envs", type=int, default=32)
    p.add_argument("--crossq-width", type=int, default=512)
    p.add_argument("--demos", help="a transitions file (default: train PPO and collect one)")
    p.add_argument("--demo-transitions", type=int, default=20000)
    args = p.parse_args(argv)
    demos = args.demos
    with tempfile.TemporaryDirectory() as tmp:
        if "rlpd" in args.algorithms and demos is None:
            demos = make_demos(args, tmp)
        results = {name: [run_one(name, seed, args, demos) for seed in args.seeds] for name in args.algorithms}
    summary = {}
    for name, runs in results.items():
        steps = [r["env_steps_to_threshold"] for r in runs]
        # A seed that never reached the threshold counts as the whole budget (a lower bound).
        budget = args.max_iterations * 640  # every algorithm here steps 64 envs x 10 steps per iteration
        median = statistics.median(s if s is not None else budget for s in steps)
        summary[name] = {"env_steps_to_threshold": steps, "median": median,
                         "reached": sum(s is not None for s in steps), "runs": runs}
        log(f"{name:>13}: env steps to {args.threshold:g} per seed {steps}, median {median}")
    sac = summary.get("sac", {}).get("median")
    for name, s in summary.items():
        s["median_vs_sac"] = round(s["median"] / sac, 3) if sac else None
    print(json.dumps({"threshold": args.threshold, "seeds": args.seeds, "crossq_width": args.crossq_width,
                      "algorithms": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
