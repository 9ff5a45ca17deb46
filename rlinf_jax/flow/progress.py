"""A rich progress bar over a run's steps, showing the latest of some headline metrics."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class ProgressBar:
    """A rich progress bar over steps showing the latest of some headline metrics."""

    def __init__(self, total: int, start: int, enabled: bool, console, label: str, shown: dict[str, str], info: str):
        self.progress = None
        self.shown = shown
        self.fields: dict[str, str] = {}
        if enabled:
            self.progress = Progress(
                TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console, transient=False,
            )
            self.task = self.progress.add_task(label, total=total, completed=start, info=info)

    def __enter__(self):
        if self.progress is not None:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def update(self, step: int, metrics: dict) -> None:
        if self.progress is None:
            return
        for key, label in self.shown.items():
            if key in metrics:
                v = metrics[key]
                self.fields[label] = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        self.progress.update(self.task, completed=step, info="  ".join(f"{k} {v}" for k, v in self.fields.items()))
