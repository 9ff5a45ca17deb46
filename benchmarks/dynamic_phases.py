#!/usr/bin/env python
"""One GRPO iteration's phases over time, disaggregated, with cluster.scaling static and dynamic.

Runs the same tiny GRPO recipe (a 2-layer, 64-wide model on single-digit sums, rollout 0-3
and actor 4-7 of 8 forced host devices) twice in child processes, once per scaling, and
reads the per-iteration timings each run logs (`time/rollout_sec`, `time/reward_sec`,
`time/switch_s`, `time/update_sec`, `time/sync_sec`). Medians over the iterations after the
first (which compiles) are drawn as one iteration's timeline per device group: which
devices generate, score on the host, move the state, update and take the new weights.

On a CPU the forced devices share the machine's cores, so wall time cannot show the gain
of updating on 8 devices instead of 4 (the plan command predicts it for chips, see
docs/placement.md); what this measures is the cost of the moves (`time/switch_s`) and
that both runs log the same training numbers.

    python benchmarks/dynamic_phases.py                 # ~1.5 min on 2 CPU cores
    python benchmarks/dynamic_phases.py --iterations 8

The last line of stdout is one JSON object: each scaling's median phase seconds, the
switch's share of the dynamic iteration, and the largest relative difference between the
two runs' training metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RECIPE = [
    "actor.model.lm.hidden_size=64", "actor.model.lm.intermediate_size=128", "actor.model.lm.num_layers=2",
    "actor.model.lm.num_heads=2", "actor.model.lm.num_kv_heads=1", "data.train_levels=[1]", "data.eval_levels=[1]",
    "rollout.max_new_tokens=12", "data.rollout_batch_size=8", "algorithm.lm.group_size=4",
    "actor.global_batch_size=16", "actor.micro_batch_size=8", "algorithm.update_epochs=2",
    "runner.progress_bar=false", "runner.tensorboard=false", "runner.log_interval=1", "runner.eval_interval=0",
    "runner.save_interval=0", "cluster.component_placement=disaggregated",
]
PHASES = ("rollout_sec", "reward_sec", "switch_s", "update_sec", "sync_sec")


def run(scaling: str, iterations: int, out: Path) -> list[dict]:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "rlinf_jax.train", "--config-name", "grpo_math", *RECIPE,
           f"runner.max_steps={iterations}", f"runner.output_dir={out}", f"runner.experiment_name={scaling}",
           f"cluster.scaling={scaling}"]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    lines = (out / scaling / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "time/update_sec" in r]


def medians(records: list[dict]) -> dict[str, float]:
    steady = records[1:] or records
    return {p: statistics.median(r.get(f"time/{p}", 0.0) for r in steady) for p in PHASES}


def timeline(t: dict[str, float], dynamic: bool, width: int = 64) -> str:
    """Two rows, one per device group, a character per 1/width of the iteration."""
    total = sum(t.values())
    cells = lambda s: max(1, round(width * s / total)) if s > 0 else 0  # noqa: E731
    gen, host, sw, upd, sync = (cells(t[p]) for p in PHASES)
    half = sw // 2
    rollout = "G" * gen + "." * host + ("S" * half + "U" * upd + "S" * (sw - half) if dynamic else " " * (sw + upd))
    actor = " " * gen + "." * host + "S" * half + "U" * upd + "S" * (sw - half) if dynamic else " " * (gen + host) + "U" * upd
    rows = [f"  devices 0-3 (rollout) |{rollout + 'W' * sync}|", f"  devices 4-7 (actor)   |{actor + 'W' * sync}|"]
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=6)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {s: run(s, args.iterations, Path(tmp)) for s in ("static", "dynamic")}
    times = {s: medians(r) for s, r in runs.items()}
    drift = 0.0
    for a, b in zip(runs["static"], runs["dynamic"]):
        for k, v in a.items():
            if k.startswith("train/") and isinstance(v, float):
                drift = max(drift, abs(v - b[k]) / max(abs(v), 1e-6))
    print("G generate (rollout)  . reward (host)  S state moves  U update  W weight sync; blank: idle")
    for s in ("static", "dynamic"):
        print(f"{s}: {sum(times[s].values()):.3f} s an iteration (median of {len(runs[s]) - 1})")
        print(timeline(times[s], s == "dynamic"))
    dyn = times["dynamic"]
    print(json.dumps({
        "devices": 8, "placement": {"rollout": "0-3", "actor": "4-7"},
        "median_phase_s": {s: {p: round(v, 4) for p, v in t.items()} for s, t in times.items()},
        "switch_share_of_dynamic_iteration": round(dyn["switch_s"] / sum(dyn.values()), 4),
        "max_relative_train_metric_difference": drift,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
