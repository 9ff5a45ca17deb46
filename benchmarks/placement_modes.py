#!/usr/bin/env python
"""Env-steps/s of one embodied PPO workload in collocated, disaggregated and hybrid layouts.

For each device count (``--devices 2,8``; forced host devices on a CPU, the real ones on
a GPU machine) a child process builds the same workload in every layout on the same
devices, compiles and warms each, and then times ``--iterations`` training iterations of
each layout in turn, ``--repeats`` rounds over the layouts; a layout's figure is the
median of its rounds. Interleaving the rounds spreads slow phases of a shared machine
over every layout instead of charging them to whichever ran at the time.

* ``collocated``: env, rollout and actor on all devices; the fused single-jit iteration;
* ``disaggregated``: env and rollout on the first half of the devices, the actor on the
  other half (the preset on 2 devices);
* ``hybrid``: env and rollout on disjoint halves, the actor on all devices, the env batch
  in 2 micro-batches streaming between env and rollout;
* ``auto``: `cluster.component_placement=auto`'s choice (on-policy), with its predicted
  throughput next to the one then measured (timed in the same rounds).

Those four run the same algorithm, strictly on-policy (``flow.max_staleness=0``), and give
the same numbers for the same seed. Two more rows run a different one and are labelled so:
``disaggregated, staleness 1`` and ``hybrid, staleness 1`` enqueue the next rollout with the
weights of one version ago, so that it overlaps the current update.

The workload (``--workload``): ``mlp`` is an MJX env (Brax ``inverted_pendulum`` on the
``mjx`` backend) with a policy of 3 x 512 units, so one policy inference costs about what
one sim step costs; ``vla`` is the tiny VLA of ``ppo_vla_tabletop`` on the rendered
tabletop (see benchmarks/vla_modes.py, which runs it), without auto-placement.

The last line of stdout is one JSON object: per device count every mode's env-steps/s,
``ratios``: each fixed layout's env-steps/s over collocated's (no maximum over layouts), and
auto's predicted vs measured. The headline ``ratio`` is the on-policy ``disaggregated``
layout's over collocated (the same algorithm in both); top-level ``ratio`` is the smallest
per-device-count one (the conservative figure), ``ratio_staleness_1`` the same for the
stale disaggregated row.
Each mode also reports ``cpu_util`` (cores this process kept busy while timed) and
``cpu_ms_per_1k_steps``: on a CPU backend, where forced devices share the machine's
cores, they show how much room overlapping stages has left.

    python benchmarks/placement_modes.py                 # 2 and 8 devices, ~6 min on 2 CPU cores
    python benchmarks/placement_modes.py --devices 2 --iterations 10 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roofline  # noqa: E402
from recorded import warn_regressions  # noqa: E402

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

# The recipe's VLA, scene, env batch (64) and update (one epoch of 2 minibatches); cached
# resets so the env batch can be cut into micro-batches, and no warm start (the timing is
# of the RL flow, not of cloning).
VLA_WORKLOAD = [
    "env.reset_mode=cached", "sft.warm_start_steps=0", "sft.critic_warmup_steps=0", "runner.progress_bar=false",
]

WORKLOADS = {"mlp": ("ppo_brax", MLP_WORKLOAD, True), "vla": ("ppo_vla_tabletop", VLA_WORKLOAD, False)}

HEADLINE = "disaggregated"  # the fixed layout of the headline ratio (on-policy, like collocated)
STALE = "disaggregated, staleness 1"  # the labelled row of another algorithm (one version behind)


def modes(num_devices: int) -> dict[str, list[str]]:
    """Each layout's overrides on ``num_devices`` devices: the on-policy layouts first, then
    the stale ones (another algorithm: the next rollout acts with weights one version old)."""
    n, half = num_devices, num_devices // 2
    # Env and rollout alternate at every step, so the disaggregated layout keeps them
    # together and gives the actor its own half (the preset on 2 devices). The 3-way
    # preset (env | rollout | actor, 2 micro-batches) measured slower here: 6,200 vs
    # 9,600 env-steps/s on 4 forced CPU devices.
    split = [f"cluster.component_placement={{'env,rollout': '0-{n - half - 1}', actor: '{n - half}-{n - 1}'}}"]
    hybrid = ["cluster.component_placement=hybrid", "flow.num_micro_batches=2"]
    return {
        "collocated": ["cluster.component_placement=collocated", "flow.max_staleness=0"],
        "disaggregated": [*split, "flow.max_staleness=0"],
        "hybrid": [*hybrid, "flow.max_staleness=0"],
        STALE: [*split, "flow.max_staleness=1"],
        "hybrid, staleness 1": [*hybrid, "flow.max_staleness=1"],
    }


class _Timed:
    """A built, compiled and warmed trainer whose iterations are timed round by round."""

    def __init__(self, trainer):
        import jax

        self.trainer = trainer
        self.state = trainer.init()
        trainer.compile(self.state, jax.random.PRNGKey(1))
        self.state, sums = trainer.run_iterations(self.state, 1)  # warm: first-call dispatch paths
        trainer.summarize(sums, 1)
        self.rounds: list[float] = []
        self.cpu: list[tuple[float, float, int]] = []  # (process CPU s, wall s, env-steps) per round

    def time(self, iterations: int) -> float:
        t0, c0 = time.perf_counter(), _cpu_seconds()
        self.state, sums = self.trainer.run_iterations(self.state, iterations)
        self.trainer.summarize(sums, iterations)  # blocks until the last iteration is done
        wall, steps = time.perf_counter() - t0, iterations * self.trainer.env_steps_per_iteration
        self.rounds.append(steps / wall)
        self.cpu.append((_cpu_seconds() - c0, wall, steps))
        return self.rounds[-1]

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    def cpu_figures(self) -> dict:
        """The process's CPU time over the timed rounds: cores kept busy on average, and CPU
        milliseconds per 1,000 env-steps. On a CPU backend these bound what any layout can
        gain: a layout doing the same work with every core busy is at most
        ``cores / util`` times faster."""
        cpu, wall, steps = (sum(x) for x in zip(*self.cpu))
        return {"cpu_util": round(cpu / wall, 2), "cpu_ms_per_1k_steps": round(1e6 * cpu / steps, 1)}


def child(workload: str, num_devices: int, iterations: int, repeats: int, extra: list[str],
          peak_gflops: float | None = None) -> dict:
    import jax

    from rlinf_jax.config import load_config
    from rlinf_jax.tasks.embodied.auto_placement import auto_placement
    from rlinf_jax.tasks.embodied.build import build_trainer
    from rlinf_jax.tasks.embodied.setup import make_setup
    from rlinf_jax.tasks.embodied.warm_start import warm_start

    recipe, base, with_auto = WORKLOADS[workload]
    out: dict = {"devices": num_devices, "platform": jax.devices()[0].platform, "modes": {}}
    timed: dict[str, _Timed] = {}
    for name, overrides in modes(num_devices).items():
        timed[name] = _Timed(build_trainer(load_config(recipe, [*base, *extra, *overrides])))
    plan = None
    if with_auto:
        cfg = load_config(recipe, [*base, *extra, "cluster.component_placement=auto", "flow.max_staleness=0"])
        setup = warm_start(cfg, make_setup(cfg))
        plan = auto_placement(cfg, setup, num_devices, log=lambda m: print("  " + m, file=sys.stderr, flush=True))
        timed["auto"] = _Timed(plan.trainer)

    for r in range(repeats):
        for name, t in timed.items():
            sps = t.time(iterations)
            print(f"  {num_devices} devices  round {r + 1}/{repeats}  {name:<27} {sps:>10,.0f} env-steps/s",
                  file=sys.stderr, flush=True)

    # Every layout does the same work per env step: counted once, on the collocated fused
    # iteration (the chunk's traced iteration count taken once; an env's own while loops,
    # e.g. a physics solver's, count one trip, so the figure is a lower bound), against
    # this process's peak (one product on its first device).
    col_t = timed["collocated"]
    flops_per_step = roofline.program_flops(col_t.trainer.run_chunk, col_t.state, jax.numpy.int32(1)) / (
        col_t.trainer.env_steps_per_iteration)
    peak = roofline.peak_flops_per_s(peak_gflops)
    out.update(flops_per_env_step=round(flops_per_step, 1), peak_flops_per_s=float(f"{peak:.4g}"))
    for name in modes(num_devices):
        t = timed[name]
        r = roofline.rate(flops_per_step, 1.0 / t.median, peak)
        out["modes"][name] = {
            "env_steps_per_sec": round(t.median, 1),
            "flops_per_s": float(f"{r['flop_per_s']:.4g}"),
            "share_of_peak": float(f"{r['share_of_peak']:.4g}"),
            "rounds": [round(x, 1) for x in t.rounds],
            "placement": t.trainer.placement.to_json(),
            "runner": type(t.trainer).__name__,
            "max_staleness": int("flow.max_staleness=1" in modes(num_devices)[name]),
            **t.cpu_figures(),
        }
    col = out["modes"]["collocated"]["env_steps_per_sec"]
    out["ratios"] = {m: round(out["modes"][m]["env_steps_per_sec"] / col, 4) for m in modes(num_devices)
                     if m != "collocated"}
    if plan is not None:
        measured = timed["auto"].median
        predicted = plan.chosen.predicted_env_steps_per_sec
        out["auto"] = {
            "chosen": plan.chosen.candidate.name,
            "placement": plan.chosen.candidate.spec,
            "num_micro_batches": plan.chosen.candidate.num_micro_batches,
            "predicted_env_steps_per_sec": round(predicted, 1),
            "measured_env_steps_per_sec": round(measured, 1),
            "rounds": [round(x, 1) for x in timed["auto"].rounds],
            "prediction_error": round(predicted / measured - 1.0, 4),
            "profile_sec": round(plan.profile_sec, 1),
            "candidates": [p.to_json() for p in plan.profiles],
        }
        out["ratios"][f"auto ({plan.chosen.candidate.name})"] = round(measured / col, 4)
        print(f"  {num_devices} devices  auto -> {plan.chosen.candidate.name}: predicted {predicted:,.0f}, "
              f"measured {measured:,.0f} env-steps/s", file=sys.stderr, flush=True)

    out["ratio"] = out["ratios"][HEADLINE]
    out["ratio_staleness_1"] = out["ratios"][STALE]
    r = roofline.rate(flops_per_step, 1.0 / out["modes"][HEADLINE]["env_steps_per_sec"], peak)
    out.update({k: v for k, v in roofline.result_keys(r, peak).items() if k != "ours_flops"})
    return out


def main(argv=None, name: str = "placement_modes") -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp", help="policy and env (default mlp)")
    ap.add_argument("--devices", default="2,8", help="comma-separated device counts (default 2,8)")
    ap.add_argument("--iterations", type=int, default=8, help="timed iterations per mode and round (default 8)")
    ap.add_argument("--repeats", type=int, default=3, help="timing rounds over the modes; medians reported (default 3)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    roofline.add_peak_argument(ap)
    ap.add_argument("overrides", nargs="*", help="extra config overrides for the workload, key=value")
    args = ap.parse_args(argv)

    if args.child is not None:
        print(json.dumps(child(args.workload, args.child, args.iterations, args.repeats, args.overrides,
                               args.peak_gflops)))
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
                "--iterations", str(args.iterations), "--repeats", str(args.repeats),
                *(["--peak-gflops", str(args.peak_gflops)] if args.peak_gflops else []), *args.overrides,
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
            f"{n} devices: " + "  ".join(f"{k} {v['env_steps_per_sec']:,.0f}" for k, v in m.items())
            + f" -> ratio {r['ratio']:.2f} ({HEADLINE}, on-policy; {r['ratio_staleness_1']:.2f} at staleness 1); "
            "CPU cores busy " + " / ".join(f"{v['cpu_util']:.2f}" for v in m.values())
        )
        if "auto" in r:
            a = r["auto"]
            line += (
                f"; auto chose {a['chosen']}: predicted {a['predicted_env_steps_per_sec']:,.0f} "
                f"vs measured {a['measured_env_steps_per_sec']:,.0f} ({a['prediction_error']:+.1%})"
            )
        print(line)
        print(f"{n} devices: " + roofline.line(
            f"FLOP/s of the {HEADLINE} layout",
            {"flops": r["flops_per_env_step"], "flop_per_s": r["ours_flops_per_s"],
             "share_of_peak": r["ours_share_of_peak"]}, r["peak_flops_per_s"])
            + "; collocated " + f"{m['collocated']['flops_per_s'] / 1e9:,.2f} GFLOP/s")
    recipe, base, _ = WORKLOADS[args.workload]
    # Beside the top-level ratio: the FLOP/s of the device count it comes from.
    at = min(results.values(), key=lambda r: r["ratio"])
    summary = {
        "benchmark": name,
        "recipe": recipe,
        "workload": base + args.overrides,
        "devices": results,
        "ratio": min(r["ratio"] for r in results.values()),
        "ratio_layout": f"{HEADLINE} (flow.max_staleness=0) / collocated",
        "ratio_staleness_1": min(r["ratio_staleness_1"] for r in results.values()),
        "ours_flops_per_s": at["ours_flops_per_s"],
        "ours_share_of_peak": at["ours_share_of_peak"],
        "peak_flops_per_s": at["peak_flops_per_s"],
    }
    warn_regressions(name, summary)
    print(json.dumps(summary))
    return 0


def _cpu_seconds() -> float:
    """User + system CPU time of this process (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _has_accelerator() -> bool:
    """True when a GPU/TPU backend is importable here (then real devices are used)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.devices()[0].platform)"], capture_output=True, text=True
    )
    return probe.returncode == 0 and probe.stdout.strip().splitlines()[-1:] != ["cpu"]


if __name__ == "__main__":
    sys.exit(main())
