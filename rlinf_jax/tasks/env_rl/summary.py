"""What a finished env-stepping run reports: `RunSummary` (printed by the CLI, returned by
`rj.train`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlinf_jax.flow import seeds


@dataclass
class RunSummary:
    run_dir: Path
    steps: int
    env_steps: int
    eval_return: float | None
    env_steps_per_sec: float
    compile_sec: float
    wall_sec: float
    resumed_from: int | None
    # Success per split of a benchmark that has them (the VLA tabletop): what its runs are judged by.
    eval_success: dict[str, float] | None = None
    # Seeds side by side: the last evaluation's metrics, each over the seeds (`flow.seeds`),
    # and how many runs there were (env_steps counts one run's, env_steps_per_sec all of them).
    last_eval: dict | None = None
    num_runs: int = 1

    def text(self) -> str:
        # A tabletop's returns are fractions of the shaped reward: a rounded one says nothing.
        ret = "n/a" if self.eval_return is None else f"{self.eval_return:.3g}" if self.eval_success else (
            f"{self.eval_return:.1f}")
        if self.last_eval is not None and "eval/return" + seeds.CI in self.last_eval:
            ret = seeds.described(self.last_eval, "eval/return", ".3g" if self.eval_success else ".1f")
        success = "" if not self.eval_success else "  final eval success " + ", ".join(
            f"{split} {value:.3f}" for split, value in self.eval_success.items()) + "\n"
        resumed = "" if self.resumed_from is None else f" (resumed from step {self.resumed_from})"
        per_run = f" per seed ({self.num_runs} seeds)" if self.num_runs > 1 else ""
        return (
            f"[bold]done[/bold]: {self.steps} iterations, {self.env_steps:,} env steps{per_run}{resumed}\n"
            f"{success}"
            f"  final eval return  {ret}\n"
            f"  env-steps/s        {self.env_steps_per_sec:,.0f}{' (all seeds)' if self.num_runs > 1 else ''}\n"
            f"  compile time       {self.compile_sec:.1f} s\n"
            f"  wall time          {self.wall_sec:.1f} s\n"
            f"  saved in           {self.run_dir}"
        )


def split_success(evaluation: dict | None) -> dict[str, float] | None:
    """``{split: success}`` of an evaluation of a benchmark with splits, else None."""
    prefix = "eval/success/"
    found = {k[len(prefix):]: v for k, v in (evaluation or {}).items() if k.startswith(prefix) and "@" not in k}
    return found or None
