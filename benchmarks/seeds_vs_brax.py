#!/usr/bin/env python
"""N seeds: ours in one program (``runner.num_seeds=N``) vs. Brax's trainer run N times.

A Brax user who wants N seeds calls ``ppo.train`` / ``sac.train`` N times (each call traces
and compiles its programs again); ours trains the N runs side by side in one vmapped program
(docs/seeds.md). Both sides use the hyperparameters of ``sac_vs_brax.py`` /
``ppo_vs_brax.py`` (the same flags are accepted after ``--``), the same float32 products,
and run in processes of their own, started with the same environment and pinned to the
same cores (``--cpus``, default: every core this process may use), with XLA's default
thread pool on both.

For each algorithm the script reports, per side:

* ``wall_s``: seconds from the first train call to the end of the last run (compile,
  evaluations and every seed included): what a user waits for N seeds;
* ``env_steps_per_sec``: N x each run's env steps / ``wall_s``;
* ``steady_env_steps_per_sec``: the same over the training epochs after each run's first
  (compile and evaluations excluded);
* ``final_eval_return`` per seed and ``time_to_threshold_s`` per seed (from the start of
  the N-seed job, so a later Brax seed counts the runs before it; ``null``: not reached);
* for ours, the share of the machine's float32 peak (``roofline.py``'s measured peak).

The last line of stdout is one JSON object with ``ratio_<algo>`` = ours / Brax's
``env_steps_per_sec`` and ``steady_ratio_<algo>``, and every side's configuration.

    python benchmarks/seeds_vs_brax.py                       # SAC and PPO, 8 seeds, inverted_pendulum
    python benchmarks/seeds_vs_brax.py --algo sac --seeds 4 -- --epochs 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brax_common import _install_device_put_replicated_shim, log, parse_cpus, run_child  # noqa: E402
from recorded import warn_regressions  # noqa: E402


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--algo", choices=["sac", "ppo", "both"], default="both")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--cpus", default=None, help="cores both sides are pinned to, e.g. 0-1 (default: all allowed)")
    p.add_argument("--peak-gflops", type=float, default=None,
                   help="the machine's float32 peak (default: measured by roofline.py)")
    p.add_argument("--side", choices=["ours", "brax"], help=argparse.SUPPRESS)  # a child's
    return p.parse_args(argv), rest


def _module(algo: str):
    if algo == "sac":
        import sac_vs_brax as mod
    else:
        import ppo_vs_brax as mod
    return mod


def _steps_per_epoch(algo: str, args) -> int:
    return args.steps_per_epoch if algo == "sac" else args.eval_every * args.steps_per_iter


def _epochs(algo: str, args) -> int:
    return args.epochs if algo == "sac" else args.num_epochs


class _NoClock:
    """The compile clock the peer scripts expect, unused here: wall time is the figure."""

    def start(self):
        pass

    def total(self):
        return 0.0

    def stop(self):
        return {"total": 0.0, "top_functions": {}}


# ------------------------------------------------------------------------------ the two sides
def brax_side(algo: str, n: int, extra: list[str]) -> dict:
    """Brax's trainer called once per seed, one after the other, as a user's loop does."""
    import jax

    _install_device_put_replicated_shim(jax)
    jax.devices()  # the backend starts before the clock, as on our side
    mod = _module(algo)
    t0 = time.perf_counter()
    runs = []
    for seed in range(n):
        args = mod.parse_args([*extra, "--seed", str(seed)])
        start = time.perf_counter() - t0
        out = mod.run_brax(args, _NoClock())
        hit = next((e for e in out["evals"] if e[2] >= args.threshold), None)
        runs.append({
            "seed": seed, "final_eval_return": out["final_eval_return"],
            "time_to_threshold_s": None if hit is None else round(start + hit[1], 2),
            "steady_steps_per_sec": out["steady_steps_per_sec"], "wall_s": out["train_call_wall_s"],
        })
    wall = time.perf_counter() - t0
    steps = _steps_per_epoch(algo, args) * _epochs(algo, args)
    steady = [r["steady_steps_per_sec"] for r in runs if r["steady_steps_per_sec"]]
    return {
        "wall_s": round(wall, 2), "env_steps_per_sec": round(n * steps / wall, 1),
        # N runs one after the other: their steady rates are each one run's.
        "steady_env_steps_per_sec": round(sum(steady) / len(steady), 1) if steady else None,
        "runs": runs, "config": f"brax {algo}.train called {n} times (seeds 0..{n - 1}), float32",
    }


def ours_side(algo: str, n: int, extra: list[str], peak_gflops: float | None) -> dict:
    """``runner.num_seeds=n``: every run in one program."""
    import jax
    import jax.numpy as jnp

    import roofline
    from brax_common import flops_per_env_step
    from rlinf_jax.flow.seeds import eval_key

    jax.devices()  # the backend starts before the clock, as on Brax's side
    mod = _module(algo)
    args = mod.parse_args([*extra, "--seed", "0"])
    t0 = time.perf_counter()
    # The peer script's config (the same hyperparameters as its Brax side), n seeds of it.
    cfg = mod.make_config(args)
    cfg.runner.num_seeds = n
    cfg.cluster.component_placement = "collocated"
    recipe = "sac_brax" if algo == "sac" else "ppo_brax"
    if algo == "sac":
        from rlinf_jax.tasks.offpolicy.run import build_trainer
    else:
        from rlinf_jax.tasks.embodied.build import build_trainer
    trainer = build_trainer(cfg)
    state = trainer.init()
    trainer.compile(state, eval_key(0, 0))
    per_epoch = _steps_per_epoch(algo, args)
    every = args.eval_every
    evals, epochs = [], []

    def evaluate(step):
        ev = trainer.run_eval(state)
        evals.append((time.perf_counter() - t0, [ev[f"eval/return@seed{s}"] for s in range(n)]))
        log(f"[ours] epoch {step // every:>3d} | wall {evals[-1][0]:7.1f} s | eval return {ev['eval/return']:8.2f} "
            f"± {ev['eval/return@ci95']:.2f} ({n} seeds)")

    evaluate(0)
    for e in range(_epochs(algo, args)):
        t = time.perf_counter()
        state, sums = trainer.run_iterations(state, every)
        trainer.summarize(sums, every)  # blocks until the chunk is done
        epochs.append(time.perf_counter() - t)
        evaluate((e + 1) * every)
    wall = time.perf_counter() - t0
    steady = (len(epochs) - 1) * per_epoch * n / sum(epochs[1:]) if len(epochs) > 1 else None
    # One iteration of every run, counted after the timing (tracing again costs no run time).
    algorithm = trainer.algorithm
    chunk = jax.jit(jax.vmap(algorithm.chunk, in_axes=(0,) + (None,) * (len(algorithm.chunk_args) + 1)))
    flops = flops_per_env_step(chunk, (state, *algorithm.chunk_args, jnp.int32(1)),
                               n * trainer.env_steps_per_iteration)
    peak = roofline.peak_flops_per_s(peak_gflops)
    runs = []
    for s in range(n):
        hit = next((w for w, rets in evals if rets[s] >= args.threshold), None)
        runs.append({"seed": s, "final_eval_return": round(evals[-1][1][s], 2),
                     "time_to_threshold_s": None if hit is None else round(hit, 2)})
    return {
        "wall_s": round(wall, 2), "env_steps_per_sec": round(n * per_epoch * len(epochs) / wall, 1),
        "steady_env_steps_per_sec": None if steady is None else round(steady, 1),
        "flops_per_env_step": round(flops, 1),
        "share_of_fp32_peak": None if not (peak and steady) else round(flops * steady / peak, 4),
        "runs": runs, "config": f"rlinf_jax {recipe} runner.num_seeds={n}, one program, float32",
    }


# ------------------------------------------------------------------------------ main
def child(args, extra) -> int:
    out = {}
    for algo in (["sac", "ppo"] if args.algo == "both" else [args.algo]):
        log(f"--- {args.side}: {algo}, {args.seeds} seeds ---")
        out[algo] = (brax_side(algo, args.seeds, extra) if args.side == "brax"
                     else ours_side(algo, args.seeds, extra, args.peak_gflops))
    print(json.dumps(out))
    return 0


def main(argv=None) -> int:
    args, extra = parse_args(argv)
    if args.side:
        return child(args, extra)
    if args.seeds < 2:
        print("error: --seeds must be at least 2 (one seed is sac_vs_brax.py / ppo_vs_brax.py)", file=sys.stderr)
        return 2
    cpus = parse_cpus(args.cpus)
    # The same environment for both sides; JAX on the CPU (where libtpu is installed but no
    # TPU is, JAX would otherwise probe for one inside the first timed call).
    env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "JAX_PLATFORMS": "cpu"}
    results = {}
    for side in ("brax", "ours"):
        cmd = [sys.executable, __file__, "--side", side,
               "--algo", args.algo, "--seeds", str(args.seeds)]
        if args.peak_gflops:
            cmd += ["--peak-gflops", str(args.peak_gflops)]
        log(f"=== {side} (own process, cores {cpus}) ===")
        results[side] = run_child([*cmd, "--", *extra], env, f"the {side} side", cpus)
    out = {"seeds": args.seeds, "cpus": cpus, "threads": "XLA default on both", "precision": "float32",
           "extra_args": extra, "ours": results["ours"], "brax": results["brax"]}
    for algo in results["ours"]:
        o, b = results["ours"][algo], results["brax"][algo]
        out[f"steady_ratio_{algo}"] = (round(o["steady_env_steps_per_sec"] / b["steady_env_steps_per_sec"], 3)
                                       if o["steady_env_steps_per_sec"] and b["steady_env_steps_per_sec"] else None)
        out[f"ratio_{algo}"] = round(o["env_steps_per_sec"] / b["env_steps_per_sec"], 3)
    warn_regressions("seeds_vs_brax", out)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
