#!/usr/bin/env python
"""A recipe's RL gain against its compute-matched control: the same wall time spent on
more supervised steps (SFT of the language model, behaviour cloning of the VLA) instead
of on RL.

Every recipe here starts RL from a warm start of ``w = sft.warm_start_steps`` supervised
steps. For each seed:

1. the recipe itself, timed from the process start to its exit (``T_rl``);
2. the control at ``w`` steps (``sft.warm_start_steps=w runner.max_steps=1``: the warm
   start alone, scored by the run's step-0 evaluation; the VLA's critic warm-up is off
   because a supervised-only policy has no use for it), timed ``T_w``;
3. the control at ``k w`` steps (``--calibrate k``, default 3), timed ``T_kw``: the seconds
   one more supervised step costs are ``s = (T_kw - T_w) / ((k - 1) w)``;
4. the compute-matched control at ``N = w + round((T_rl - T_w) / s)`` steps, timed ``T_N``
   (printed beside ``T_rl``, so a reader sees how well the two match).

Every run is a process of its own with the persistent compilation cache off, so each
pays for its own compiles, as a first run does (with a shared cache the order of the runs
would decide who compiles). Each control's score is its step-0 evaluation, on the same held-out problems or episodes
as the recipe's own evaluations. Reported per seed: the warm start (the recipe's step 0),
the recipe's last evaluation and the mean of its last ``--tail`` evaluations, and the three
controls; then the means over seeds of the recipe's gain over its warm start and over the
compute-matched control. The last line of stdout is one JSON object with all of it.

    python benchmarks/rl_vs_sft.py --recipe grpo_math --seeds 0 1
    python benchmarks/rl_vs_sft.py --recipe ppo_vla_tabletop --seeds 0
    python benchmarks/rl_vs_sft.py --recipe grpo_tool_calc --seeds 0 1 2

Overrides (``key=value``) go to every run, e.g. smaller models for a quick look; put them
after ``--`` when they follow ``--seeds``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlinf_jax.config import load_config
from rlinf_jax.errors import BadInput
from rlinf_jax.runtime import read_metrics

# Per recipe: the score read from each evaluation, scores printed beside it, and the
# overrides that make a run of the recipe a supervised-only control.
RECIPES = {
    "grpo_math": {"metric": "eval/accuracy", "also": ["eval/accuracy_level1"], "control": []},
    "grpo_tool_calc": {"metric": "eval/accuracy", "also": ["eval/accuracy_level1", "eval/accuracy_level2"], "control": []},
    "ppo_vla_tabletop": {"metric": "eval/success/train", "also": ["eval/success/vision"],
                         "control": ["sft.critic_warmup_steps=0"]},
}
QUIET = ["runner.progress_bar=false", "runner.tensorboard=false", 'runner.compilation_cache=""']


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fail(msg: str, code: int = 2):
    """One ``error:`` line and the exit status: 2 for bad input, 1 for a run that failed."""
    print(f"error: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def train(recipe: str, out: Path, name: str, overrides: list[str]) -> tuple[float, list[dict]]:
    """One ``python -m rlinf_jax.train`` run in a process of its own: (wall seconds, its
    metrics records)."""
    cmd = [sys.executable, "-m", "rlinf_jax.train", "--config-name", recipe, f"runner.output_dir={out}",
           f"runner.experiment_name={name}", *QUIET, *overrides]
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        fail(f"{' '.join(cmd[1:])} exited {done.returncode}:\n{done.stderr[-2000:]}", code=1)
    return wall, read_metrics(out / name)


def evaluations(records: list[dict], metric: str) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[metric])) for r in records if metric in r]


def step0(records: list[dict], keys: list[str]) -> dict:
    first = next((r for r in records if r["step"] == 0 and keys[0] in r), None)
    if first is None:
        fail(f"the run logged no {keys[0]} at step 0; keep the recipe's evaluation at step 0")
    return {key: round(float(first[key]), 4) for key in keys if key in first}


def one_seed(args, seed: int, out: Path) -> dict:
    spec = RECIPES[args.recipe]
    keys = [spec["metric"], *spec["also"]]
    common = [f"runner.seed={seed}", *args.overrides]
    try:
        w = load_config(args.recipe, common).sft.warm_start_steps
    except BadInput as e:
        fail(str(e))
    if w <= 0:
        fail(f"{args.recipe} with these overrides has no warm start (sft.warm_start_steps={w})")
    t_rl, rl = train(args.recipe, out, f"rl_s{seed}", common)
    curve = evaluations(rl, spec["metric"])
    log(f"[seed {seed}] recipe: {t_rl:.0f} s, {spec['metric']} {[(s, round(v, 3)) for s, v in curve]}")

    def control(steps: int, name: str) -> tuple[float, dict]:
        wall, recs = train(args.recipe, out, f"{name}_s{seed}",
                           [*common, *spec["control"], f"sft.warm_start_steps={steps}", "runner.max_steps=1"])
        scores = step0(recs, keys)
        log(f"[seed {seed}] control, {steps} supervised steps: {wall:.0f} s, {scores}")
        return wall, scores

    t_w, at_w = control(w, "warm")
    times = args.calibrate
    t_kw, at_kw = control(times * w, "calibration")
    per_step = (t_kw - t_w) / ((times - 1) * w)
    if per_step <= 0:
        fail(f"{times * w} supervised steps took no longer than {w} ({t_kw:.0f} s against {t_w:.0f} s): "
             "the machine is too noisy to calibrate; rerun alone, or with a larger --calibrate")
    n = w + max(0, round((t_rl - t_w) / per_step))
    t_n, at_n = control(n, "matched")  # a run of its own even when n == w
    tail = [v for _, v in curve[-args.tail:]]
    warm = step0(rl, keys)
    return {
        "seed": seed,
        "warm_start": warm,
        "recipe": {"wall_s": round(t_rl, 1), "final": round(curve[-1][1], 4), f"mean_last_{args.tail}": round(statistics.mean(tail), 4),
                   "curve": [[s, round(v, 4)] for s, v in curve],
                   "final_also": {key: round(float(v), 4) for key, v in rl[-1].items() if key in spec["also"]}},
        "controls": [
            {"steps": w, "wall_s": round(t_w, 1), **at_w},
            {"steps": times * w, "wall_s": round(t_kw, 1), **at_kw},
            {"steps": n, "wall_s": round(t_n, 1), "compute_matched": True, **at_n},
        ],
        "seconds_per_supervised_step": round(per_step, 4),
        "gain_over_warm_start": round(curve[-1][1] - warm[spec["metric"]], 4),
        "gain_over_control": round(curve[-1][1] - at_n[spec["metric"]], 4),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/rl_vs_sft.py", description=__doc__.splitlines()[0])
    p.add_argument("--recipe", choices=sorted(RECIPES), default="grpo_math")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--tail", type=int, default=3, help="evaluations averaged at the end of the recipe (default 3)")
    p.add_argument("--calibrate", type=int, default=3, help="the second control runs this many times the warm start's steps (default 3)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides for every run")
    args = p.parse_args(argv)
    if args.tail < 1 or args.calibrate < 2:
        fail("--tail must be >= 1 and --calibrate >= 2")
    metric = RECIPES[args.recipe]["metric"]
    with tempfile.TemporaryDirectory() as tmp:
        seeds = [one_seed(args, s, Path(tmp)) for s in args.seeds]
    for r in seeds:
        c = r["controls"][-1]
        log(f"seed {r['seed']}: warm start {r['warm_start'][metric]:.3f} -> recipe {r['recipe']['final']:.3f} "
            f"({r['recipe']['wall_s']:.0f} s) | control {c['steps']} steps {c[metric]:.3f} ({c['wall_s']:.0f} s)")
    summary = {
        "recipe": args.recipe, "metric": metric, "overrides": args.overrides,
        # How the two sides ran: the same recipe, machine and precision; the control differs
        # by these overrides alone.
        "control": [*RECIPES[args.recipe]["control"], "sft.warm_start_steps=N", "runner.max_steps=1"],
        "processes": "own, one after another", "compilation_cache": "off", "seeds": seeds,
        "mean_gain_over_warm_start": round(statistics.mean(r["gain_over_warm_start"] for r in seeds), 4),
        "mean_gain_over_control": round(statistics.mean(r["gain_over_control"] for r in seeds), 4),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
