"""Scalar metrics to ``metrics.jsonl`` (one JSON object per ``log`` call) and TensorBoard.

Line format: ``{"step": 10, "train/policy_loss": 0.12, "env/return": 310.5, ...}`` with
``step`` first and namespaced keys after it, in the order given. Values are JSON
numbers; a non-finite float is written as the string ``"nan"``, ``"inf"`` or ``"-inf"``
so each line stays strict JSON yet keeps the information (``float("nan")`` reads it
back, and ``read_metrics`` does so for you).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from rlinf_jax.errors import BadInput
from rlinf_jax.runtime.files import write_atomic
from rlinf_jax.runtime.run_dir import RunDir

# How a run of seeds side by side (`flow.seeds`) names its metrics beside the mean ``key``:
# ``key@ci95`` the half-width of its 95% interval, ``key@seedS`` the run of seed S.
CI = "@ci95"
SEED = "@seed"

_writer_ids = itertools.count()
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _summary_writer_class():
    """tensorboardX's ``SummaryWriter``, imported without importing torch.

    tensorboardX's writer module imports torch whenever it is installed, only for the type
    hints of its ``add_*`` methods (we pass floats and numpy arrays): seconds of every
    run's start where torch is installed, more than the rest of a cached run's imports.
    A ``None`` in ``sys.modules`` makes that import fail fast, which tensorboardX handles.
    Where torch is already loaded there is nothing to save and nothing is hidden.
    """
    if "torch" not in sys.modules and "tensorboardX.writer" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]
        try:
            import tensorboardX.writer  # noqa: F401
        finally:
            del sys.modules["torch"]
    from tensorboardX import SummaryWriter

    return SummaryWriter


def _scalar(key: str, value: Any) -> int | float:
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    arr = np.asarray(value)  # jax arrays land here (a device -> host copy)
    if arr.size != 1 or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise TypeError(f"metric {key!r} must be a numeric scalar, got {type(value).__name__} of shape {arr.shape}")
    return _scalar(key, arr.reshape(()).item())


def _json_value(v: int | float) -> int | float | str:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _from_json(record: dict) -> dict:
    return {k: _NONFINITE.get(v, v) if isinstance(v, str) else v for k, v in record.items()}


def _parse_lines(text: str, path: Path) -> list[dict]:
    """Records of a metrics.jsonl; a torn last line (crash mid-write) is dropped."""
    lines = text.splitlines()
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "step" not in rec:
                raise ValueError("not an object with a step")
        except ValueError:
            if i == len(lines) - 1:
                break
            raise BadInput(f"{path} line {i + 1} is not a metrics record; fix or delete that line") from None
        records.append(rec)
    return records


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a metrics.jsonl (or of a run directory's), non-finite values as floats."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise BadInput(f"no metrics file at {path}")
    return [_from_json(r) for r in _parse_lines(path.read_text(), path)]


class MetricsLogger:
    """Writes ``<run_dir>/metrics.jsonl`` and ``<run_dir>/tensorboard/``; flushes every call.

    ``write=False`` makes a logger that checks and returns records but touches no file:
    what the processes other than process 0 of a multi-host run hold.
    """

    def __init__(self, run_dir: RunDir | str | os.PathLike, tensorboard: bool = True, write: bool = True):
        root = run_dir.path if isinstance(run_dir, RunDir) else Path(run_dir)
        self.path = root / "metrics.jsonl"
        self.tensorboard_dir = root / "tensorboard"
        self.write = write
        self._use_tb = tensorboard and write
        # Opened on the first log, so a truncate_after before it costs no extra file.
        self._writer = None
        self._purge_step: int | None = None
        self._file = None
        if write:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._repair_tail()
            self._file = open(self.path, "a")

    def _tb(self):
        if self._writer is None and self._use_tb:
            self._open_writer(self._purge_step)
        return self._writer

    def _open_writer(self, purge_step: int | None) -> None:
        SummaryWriter = _summary_writer_class()  # writes event files itself, no TensorFlow

        # tensorboardX names event files by the second and hostname and opens them with
        # "wb": a second writer within the same second (resume, truncate_after) would wipe
        # the first one's file. A per-writer suffix keeps them apart.
        suffix = f".{os.getpid()}.{next(_writer_ids)}"
        self._writer = SummaryWriter(
            logdir=str(self.tensorboard_dir), purge_step=purge_step, flush_secs=30, filename_suffix=suffix
        )

    def _repair_tail(self) -> None:
        # A crash mid-write leaves a line without its newline; appending would glue the
        # next record onto it and corrupt both.
        if self.path.is_file() and self.path.stat().st_size:
            text = self.path.read_text()
            if not text.endswith("\n"):
                records = _parse_lines(text, self.path)
                write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in records))

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict:
        """Appends one record and writes the same scalars to TensorBoard; returns the record."""
        step = int(step)
        record: dict[str, Any] = {"step": step}
        for key, value in metrics.items():
            if not isinstance(key, str) or key == "step":
                raise ValueError(f"metric names must be strings other than 'step', got {key!r}")
            record[key] = _scalar(key, value)
        if not self.write:
            return record
        self._file.write(json.dumps({k: _json_value(v) for k, v in record.items()}, allow_nan=False) + "\n")
        self._file.flush()
        writer = self._tb()
        if writer is not None:
            for key, value in record.items():
                if key != "step":
                    writer.add_scalar(key, value, global_step=step)
            writer.flush()
        return record

    def log_text(self, step: int, tag: str, text: str) -> None:
        """A text panel in TensorBoard (the resolved config, sample generations); not in
        metrics.jsonl, which holds scalars only."""
        writer = self._tb() if self.write else None
        if writer is not None:
            writer.add_text(tag, text, global_step=int(step))
            writer.flush()

    def log_image(self, step: int, tag: str, image) -> None:
        """An image in TensorBoard: ``image`` is ``[H, W, 3]`` uint8 (an episode strip)."""
        writer = self._tb() if self.write else None
        if writer is not None:
            writer.add_image(tag, np.asarray(image, np.uint8), global_step=int(step), dataformats="HWC")
            writer.flush()

    def sync(self) -> None:
        """Makes every logged record durable (fsync): called at each checkpoint."""
        if self.write and self._file is not None and not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())

    def truncate_after(self, step: int) -> int:
        """Drops records with ``step`` greater than ``step``; returns how many went.

        Used on resume: those records came from iterations after the checkpoint and will
        be logged again. TensorBoard events cannot be edited, so its writer is reopened
        with ``purge_step``, which makes TensorBoard hide the stale ones.
        """
        if not self.write:
            return 0
        self._file.close()
        records = _parse_lines(self.path.read_text(), self.path) if self.path.is_file() else []
        kept = [r for r in records if r["step"] <= step]
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file = open(self.path, "a")
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._purge_step = step + 1
        return len(records) - len(kept)

    def close(self) -> None:
        """Closes the file and the TensorBoard writer (and its thread), the writer even when
        closing the file fails (a full disk fails the last flush)."""
        try:
            if self._file is not None and not self._file.closed:
                self._file.close()
        finally:
            if self._writer is not None:
                writer, self._writer = self._writer, None
                writer.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
