#!/usr/bin/env python
"""Env-steps/s of one embodied PPO workload in collocated, disaggregated and hybrid layouts.

For each device count (``--devices 2,8``; forced host devices on a CPU, the real ones on
a GPU machine) a child process builds the same workload in every layout on the same
devices and times ``--iterations`` training iterations after a warm-up:

* ``collocated``: env, rollout and actor on all devices; the fused single-jit iteration;
* ``disaggregated``: the preset split (env+rollout | actor, or env | rollout | actor);
  the next rollout overlaps the current update (``flow.max_staleness=1``);
* ``hybrid``: env and rollout on disjoint halves, the actor on all devices, the env batch
  in 2 micro-batches streaming between env and rollout (``max_staleness=1`` too);
* ``auto``: `cluster.component_placement=auto`'s choice, with its predicted throughput
  next to the one then measured.

The workload (``--workload``): ``mlp`` is an MJX env (Brax ``inverted_pendulum`` on the
``mjx`` backend) with a policy of 3 x 512 units, so one policy inference costs about what
one sim step costs; ``vla`` is the tiny VLA of ``ppo_vla_tabletop`` on the rendered
tabletop (see benchmarks/vla_modes.py, which runs it), without auto-placement.

The last line of stdout is one JSON object: per device count every mode's env-steps/s,
``ratio`` = best pipelined mode / collocated, and auto's predicted vs measured; top-level
``ratio`` is the smallest per-device-count ratio (the conservative figure).

    python benchmarks/placement_modes.py                 # 2 and 8 devices, ~6 min on 2 CPU cores
    python benchmarks/placement_modes.py --devices 2 --iterations 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MLP_WORKLOAD = [
    "env.suite=brax",
    "env.name=inverted_pendulum",
    "env.backend=mjx",
    "env.num_envs=128",
    "env.num_eval_envs=128",
    "algorithm.rollout_length=32",
    "algorithm.num_minibatches=8",
    "algorithm.update_epochs=2",
    "actor.model.policy_hidden_sizes=[512,512,512]",
    "actor.model.value_hidden_sizes=[256,256]",
    "runner.progress_bar=false",
]

# The recipe's VLA and scene; cached resets so the env batch can be cut into micro-batches,
# and no warm start (the timing is of the RL flow, not of behaviour cloning).
VLA_WORKLOAD = ["env.reset_mode=cached", "sft.warm_start_steps=0", "runner.progress_bar=false"]

WORKLOADS = {"mlp": ("ppo_brax", MLP_WORKLOAD, True), "vla": ("ppo_vla_tabletop", VLA_WORKLOAD, False)}

MODES = {
    "collocated": ["cluster.component_placement=collocated"],
    "disaggregated": ["cluster.component_placement=disaggregated", "flow.max_staleness=1"],
    "hybrid": ["cluster.component_placement=hybrid", "flow.num_micro_batches=2", "flow.max_staleness=1"],
}


def _time_trainer(trainer, iterations: int) -> float:
    import jax

    state = trainer.init()
    trainer.compile(state, jax.random.PRNGKey(1))
    state, sums = trainer.run_iterations(state, 1)  # warm: first-call dispatch paths
    trainer.summarize(sums, 1)
    t0 = time.perf_counter()
    state, sums = trainer.run_iterations(state, iterations)
    trainer.summarize(sums, iterations)  # blocks until the last iteration is done
    return iterations * trainer.env_steps_per_iteration / (time.perf_counter() - t0)


def child(workload: str, num_devices: int, iterations: int, extra: list[str]) -> dict:
    import jax

    from rlinf_jax.config import load_config
    from rlinf_jax.flow.auto_placement import auto_placement
    from rlinf_jax.flow.embodied_runner import build_trainer

    recipe, base, with_auto = WORKLOADS[workload]
    out: dict = {"devices": num_devices, "platform": jax.devices()[0].platform, "modes": {}}
    for name, overrides in MODES.items():
        cfg = load_config(recipe, [*base, *extra, *overrides])
        trainer = build_trainer(cfg)
        sps = _time_trainer(trainer, iterations)
        out["modes"][name] = {
            "env_steps_per_sec": round(sps, 1),
            "placement": trainer.placement.to_json(),
            "runner": type(trainer).__name__,
        }
        print(f"  {num_devices} devices  {name:<14} {sps:>10,.0f} env-steps/s", file=sys.stderr, flush=True)

    col = out["modes"]["collocated"]["env_steps_per_sec"]
    best = max(("disaggregated", "hybrid"), key=lambda m: out["modes"][m]["env_steps_per_sec"])
    out["best_pipelined"] = best
    out["ratio"] = round(out["modes"][best]["env_steps_per_sec"] / col, 4)
    if not with_auto:
        return out

    cfg = load_config(recipe, [*base, *extra, "cluster.component_placement=auto", "flow.max_staleness=1"])
    plan = auto_placement(cfg, num_devices, log=lambda m: print("  " + m, file=sys.stderr, flush=True))
    plan.trainer.auto_plan = plan
    measured = _time_trainer(plan.trainer, iterations)
    predicted = plan.chosen.predicted_env_steps_per_sec
    out["auto"] = {
        "chosen": plan.chosen.candidate.name,
        "placement": plan.chosen.candidate.spec,
        "num_micro_batches": plan.chosen.candidate.num_micro_batches,
        "predicted_env_steps_per_sec": round(predicted, 1),
        "measured_env_steps_per_sec": round(measured, 1),
        "prediction_error": round(predicted / measured - 1.0, 4),
        "profile_sec": round(plan.profile_sec, 1),
        "candidates": [p.to_json() for p in plan.profiles],
    }
    print(
        f"  {num_devices} devices  auto -> {plan.chosen.candidate.name}: predicted {predicted:,.0f}, "
        f"measured {measured:,.0f} env-steps/s",
        file=sys.stderr,
        flush=True,
    )
    return out


def main(argv=None, name: str = "placement_modes") -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp", help="policy and env (default mlp)")
    ap.add_argument("--devices", default="2,8", help="comma-separated device counts (default 2,8)")
    ap.add_argument("--iterations", type=int, default=8, help="timed iterations per mode (default 8)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="extra config overrides for the workload, key=value")
    args = ap.parse_args(argv)

    if args.child is not None:
        print(json.dumps(child(args.workload, args.child, args.iterations, args.overrides)))
        return 0

    results = {}
    for n in (int(x) for x in args.devices.split(",")):
        env = dict(os.environ)
        if os.environ.get("JAX_PLATFORMS", "cpu") == "cpu" and not _has_accelerator():
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}").strip()
        print(f"{n} device(s):", file=sys.stderr, flush=True)
        proc = subprocess.run(
            [
                sys.executable, os.path.abspath(__file__), "--workload", args.workload, "--child", str(n),
                "--iterations", str(args.iterations), *args.overrides,
            ],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        if proc.returncode != 0:
            print(f"child for {n} devices failed (exit {proc.returncode})", file=sys.stderr)
            return proc.returncode
        results[str(n)] = json.loads(proc.stdout.strip().splitlines()[-1])

    for n, r in results.items():
        m = r["modes"]
        line = (
            f"{n} devices: collocated {m['collocated']['env_steps_per_sec']:,.0f}  disaggregated "
            f"{m['disaggregated']['env_steps_per_sec']:,.0f}  hybrid {m['hybrid']['env_steps_per_sec']:,.0f}  "
            f"-> ratio {r['ratio']:.2f}"
        )
        if "auto" in r:
            a = r["auto"]
            line += (
                f"; auto chose {a['chosen']}: predicted {a['predicted_env_steps_per_sec']:,.0f} "
                f"vs measured {a['measured_env_steps_per_sec']:,.0f} ({a['prediction_error']:+.1%})"
            )
        print(line)
    recipe, base, _ = WORKLOADS[args.workload]
    summary = {
        "benchmark": name,
        "recipe": recipe,
        "workload": base + args.overrides,
        "devices": results,
        "ratio": min(r["ratio"] for r in results.values()),
    }
    print(json.dumps(summary))
    return 0


def _has_accelerator() -> bool:
    """True when a GPU/TPU backend is importable here (then real devices are used)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.devices()[0].platform)"], capture_output=True, text=True
    )
    return probe.returncode == 0 and probe.stdout.strip().splitlines()[-1:] != ["cpu"]


if __name__ == "__main__":
    sys.exit(main())
