"""A run's progress over its steps, with the latest of some headline metrics.

On a terminal (or in Jupyter) it is a live rich bar; when the terminal is too narrow for
the bar and the metrics on one line, the metrics go on a line of their own rather than
being cut off. When output goes to a file or a pipe (a batch job's log, `tee`), a live bar
shows nothing until the run ends, so plain lines are printed instead: one when the run
starts, one at most every `PLAIN_EVERY_S` seconds as chunks finish, and the last one.
"""

from __future__ import annotations

import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

PLAIN_EVERY_S = 30.0
# What the columns other than the metrics take at least (label, a short bar, M/N, two clocks).
_FIXED_WIDTH = 48


class _Bar(Progress):
    """A rich progress bar whose metrics move to a second line when one would not hold them."""

    def get_renderables(self):
        tasks = self.tasks
        infos = [str(t.fields.get("info", "")) for t in tasks]
        if all(_FIXED_WIDTH + len(i) <= self.console.width for i in infos):
            yield self.make_tasks_table(tasks)
            return
        columns = self.columns
        self.columns = columns[:-1]  # the metrics column, below instead
        try:
            yield self.make_tasks_table(tasks)
        finally:
            self.columns = columns
        for info in infos:
            if info:
                yield Text("  " + info, overflow="fold")


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressBar:
    """Progress over ``total`` steps from ``start``, showing the latest of ``shown``'s metrics
    (metric -> label); nothing at all unless ``enabled``."""

    def __init__(self, total: int, start: int, enabled: bool, console, label: str, shown: dict[str, str], info: str):
        self.progress = None
        self.plain = None  # the console plain lines go to, when it is not a terminal
        self.total, self.start, self.label, self.shown = total, start, label, shown
        self.fields: dict[str, str] = {}
        self.info = info
        if not enabled:
            return
        if console is not None and not console.is_terminal and not console.is_jupyter:
            self.plain = console
            self._t0 = self._last = time.monotonic()
            self._step = start
            self._line(start)
            return
        self.progress = _Bar(
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
        elif self.plain is not None and exc[0] is None and self._step_printed != self._step:
            self._line(self._step)  # where the run ended, if the last chunk was not shown

    def _line(self, step: int) -> None:
        elapsed = time.monotonic() - self._t0
        done = step - self.start
        eta = f"  eta {_clock(elapsed / done * (self.total - step))}" if 0 < done and step < self.total else ""
        pct = 100.0 * step / self.total if self.total else 100.0
        info = f"  {self.info}" if self.info else ""
        self.plain.print(f"{self.label} {step}/{self.total} ({pct:.0f}%)  elapsed {_clock(elapsed)}{eta}{info}",
                         soft_wrap=True, highlight=False, markup=False)
        self._step_printed = step
        self._last = time.monotonic()

    def update(self, step: int, metrics: dict) -> None:
        if self.progress is None and self.plain is None:
            return
        for key, label in self.shown.items():
            if key in metrics:
                v = metrics[key]
                self.fields[label] = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        self.info = "  ".join(f"{k} {v}" for k, v in self.fields.items())
        if self.plain is not None:
            self._step = step
            if step >= self.total or time.monotonic() - self._last >= PLAIN_EVERY_S:
                self._line(step)
            return
        self.progress.update(self.task, completed=step, info=self.info)
