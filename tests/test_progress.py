"""The progress display (`rlinf_jax.flow.progress`): plain lines when output goes to a file or a
pipe, and a live bar that never cuts off its own numbers on a narrow terminal."""

from __future__ import annotations

import io
import re

from rich.console import Console

import rlinf_jax.flow.progress as progress
from rlinf_jax.flow.progress import ProgressBar

SHOWN = {"eval/return": "eval", "env/return": "return", "time/env_steps_per_sec": "steps/s"}
METRICS = {"eval/return": 912.25, "env/return": 850.5, "time/env_steps_per_sec": 9512.0}


def _screen(raw: str) -> list[str]:
    """What a terminal shows last of rich's output: escape codes dropped, lines of the final frame."""
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", raw).replace("\r", "\n")
    return [ln.rstrip() for ln in text.splitlines() if ln.strip()]


def test_output_to_a_file_gets_plain_lines_as_the_run_goes(monkeypatch):
    out = io.StringIO()
    console = Console(file=out, width=80)  # not a terminal: a log file, a pipe
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)
    with ProgressBar(100, 0, True, console, "train", SHOWN, "compiling...") as bar:
        assert out.getvalue() == "train 0/100 (0%)  elapsed 0:00:00  compiling...\n"  # at once, not at the end
        bar.update(40, METRICS)
        bar.update(100, METRICS)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert re.fullmatch(r"train 40/100 \(40%\)  elapsed \d:\d\d:\d\d  eta \d:\d\d:\d\d  eval 912  return 850  "
                        r"steps/s 9,512", lines[1]), lines[1]
    assert lines[2].startswith("train 100/100 (100%)") and "eta" not in lines[2]


def test_plain_lines_come_at_most_every_interval_and_the_end_is_always_shown(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 3600.0)
    with ProgressBar(100, 20, True, Console(file=out, width=80), "train", SHOWN, "") as bar:
        for step in (30, 40, 50):
            bar.update(step, METRICS)
    lines = out.getvalue().splitlines()
    # The start, nothing in between (the interval has not passed), and where it ended.
    assert [ln.split()[1] for ln in lines] == ["20/100", "50/100"]


def test_a_disabled_bar_prints_nothing():
    out = io.StringIO()
    with ProgressBar(10, 0, False, Console(file=out, width=80), "train", SHOWN, "x") as bar:
        bar.update(10, METRICS)
    assert out.getvalue() == ""


def test_an_80_column_terminal_shows_every_number_in_full():
    shown = {f"eval/success/{s}": s for s in ("train", "vision", "semantic", "execution")}
    shown["time/env_steps_per_sec"] = "steps/s"
    metrics = {"eval/success/train": 0.28125, "eval/success/vision": 0.1875, "eval/success/semantic": 0.25,
               "eval/success/execution": 0.125, "time/env_steps_per_sec": 123456.0}
    for width in (80, 200):
        out = io.StringIO()
        console = Console(file=out, width=width, force_terminal=True, color_system=None)
        with ProgressBar(1000, 0, True, console, "train", shown, "") as bar:
            bar.update(120, metrics)
        screen = _screen(out.getvalue())
        shown_text = " ".join(screen[-2:])
        for number in ("train 0.281", "vision 0.188", "semantic 0.25", "execution 0.125", "steps/s 123,456", "120/1000"):
            assert number in shown_text, (width, screen[-2:])
        assert all(len(ln) <= width for ln in screen) and "…" not in shown_text
        # Wide enough: one line; at 80 columns the numbers take a line of their own.
        assert ("120/1000" in screen[-1]) == (width == 200), screen[-2:]
