"""A rich progress bar over training steps that shows the latest headline metrics."""

from __future__ import annotations

import contextlib

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

_SHOWN = {"eval/return": "eval", "env/return": "return", "time/env_steps_per_sec": "steps/s"}


class _Bar:
    def __init__(self, progress: Progress | None, task):
        self.progress, self.task = progress, task
        self.fields: dict[str, str] = {}

    def update(self, step: int, metrics: dict):
        if self.progress is None:
            return
        for key, label in _SHOWN.items():
            if key in metrics:
                v = metrics[key]
                self.fields[label] = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        text = "  ".join(f"{k} {v}" for k, v in self.fields.items())
        self.progress.update(self.task, completed=step, info=text)


@contextlib.contextmanager
def progress_bar(total: int, start: int = 0, enabled: bool = True, console=None):
    if not enabled:
        yield _Bar(None, None)
        return
    progress = Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=False,
    )
    with progress:
        task = progress.add_task("train", total=total, completed=start, info="compiling...")
        yield _Bar(progress, task)
