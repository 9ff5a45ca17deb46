"""The host loop of a language-model run (sft or reasoning) and its summary.

A checkpoint holds the trainer's arrays (policy, optimiser state, step) and, in its
metadata, the data loader's cursor and the model's architecture, so ``actor.model.path``
can point at any sft / reasoning run. Before step 1 the held-out set is scored once
(``eval/accuracy`` at step 0): the starting point RL's gain is read from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rlinf_jax.flow.host_loop import HostLoop, LoopResult


@dataclass
class LMRunSummary:
    run_dir: Path
    task: str
    steps: int
    initial_accuracy: float | None  # the headline eval metric at step 0
    eval_accuracy: float | None  # at the last evaluation
    samples_per_sec: float
    wall_sec: float
    resumed_from: int | None
    warm_start: Path | None
    metric: str = "accuracy"  # what initial_accuracy / eval_accuracy measure (VLA SFT: success)

    def text(self) -> str:
        def acc(v):
            return "n/a" if v is None else f"{v:.3f}"

        resumed = "" if self.resumed_from is None else f" (resumed from step {self.resumed_from})"
        warm = "" if self.warm_start is None else f"\n  warm start         {self.warm_start}"
        return (
            f"[bold]done[/bold]: {self.steps} {self.task} steps{resumed}\n"
            f"  eval {self.metric:<13} {acc(self.initial_accuracy)} at step 0 -> {acc(self.eval_accuracy)}\n"
            f"  samples/s          {self.samples_per_sec:,.1f}\n"
            f"  wall time          {self.wall_sec:.1f} s{warm}\n"
            f"  saved in           {self.run_dir}"
        )

    @classmethod
    def of(cls, result: LoopResult, task: str, samples_per_iteration: int, wall_sec: float,
           warm_start: Path | None = None, metric: str = "accuracy") -> LMRunSummary:
        key = f"eval/{metric}"

        def headline(record):
            return None if record is None else record.get(key)

        ran = result.step - result.start_step
        return cls(
            run_dir=result.run_dir,
            task=task,
            steps=result.step,
            initial_accuracy=headline(result.first),
            eval_accuracy=headline(result.last_eval),
            samples_per_sec=ran * samples_per_iteration / result.train_sec if result.train_sec else 0.0,
            wall_sec=wall_sec,
            resumed_from=result.resumed_from,
            warm_start=warm_start,
            metric=metric,
        )


class LMLoop(HostLoop):
    """The host loop of an sft / reasoning run: the held-out set is scored at step 0, and
    a checkpoint's metadata carries the data cursor and the model's architecture."""

    bar_info = "evaluating..."
    shown: ClassVar[dict[str, str]] = {
        "eval/accuracy": "acc", "rollout/reward_mean": "reward", "train/loss": "loss", "time/step_sec": "s/step"
    }
    eval_metric = "eval/accuracy"
    unit = "steps"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.label = "sft" if self.cfg.runner.task == "sft" else "rl"

    def placement_info(self, metrics: dict | None = None) -> dict:
        info = self.trainer.placement.to_json()
        info["runner"] = type(self.trainer).__name__
        info["model"] = self.trainer.model_source
        return info

    def first_record(self, state) -> dict:
        return self.evaluate(state, 0)

    def eval_media(self, state, step: int) -> dict:
        samples = self.trainer.last_samples
        if not samples:
            return {}
        # A markdown table: TensorBoard's text panel renders it.
        def cell(text) -> str:
            return str(text).replace("|", "\\|").replace("\n", " ")[:200]

        rows = [f"| {cell(r['prompt'])} | {cell(r['answer'])} | {cell(r['responses'][0])} | "
                f"{'yes' if r['correct'][0] > 0.5 else 'no'} |" for r in samples]
        return {"eval/samples": "| prompt | answer | response | correct |\n|---|---|---|---|\n" + "\n".join(rows)}

    def run_chunk(self, state, n: int):
        return self.trainer.run_iterations(state, n)
