"""What a command does with an exception nobody expected: exit code 70, one line on stderr,
the traceback in a file.

A bug's traceback is for whoever fixes it, not for the person watching the run: it goes
to ``crash-<time>-<pid>.txt`` in the run folder (or the system's temporary folder when
there is none, or it cannot be written), and stderr gets one line naming the exception
and that file. The launcher restarts a process that exits 70 from its last checkpoint.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

EXIT_CRASHED = 70  # BSD's EX_SOFTWARE: an internal error


def _report_path(folder: Path) -> Path:
    return folder / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"


def write_report(error: BaseException, folder: str | os.PathLike | None) -> Path | None:
    """Writes ``error``'s traceback, the command line and the interpreter into a new file
    in ``folder`` (made when missing; the temporary folder when there is none or it
    cannot be written); None when nothing can be written."""
    text = (
        f"command: {' '.join([sys.executable, *sys.argv])}\n"
        f"python: {sys.version.split()[0]}\n\n"
        + "".join(traceback.format_exception(error))
    )
    candidates = [Path(folder)] if folder is not None else []
    candidates.append(Path(tempfile.gettempdir()))
    for where in candidates:
        path = _report_path(where)
        try:
            # A run that crashed before it wrote anything still gets its folder: where
            # its user looks first.
            where.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return path
        except OSError:
            continue
    return None


def report_crash(error: BaseException, folder: str | os.PathLike | None = None) -> int:
    """Writes the report, prints the one line, and returns the exit code (70)."""
    path = write_report(error, folder)
    summary = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".rstrip(": ")
    if len(summary) > 300:
        summary = summary[:300] + "..."
    where = f"the traceback is in {path}" if path is not None else "the traceback could not be written anywhere"
    print(f"crash: {summary} ({where}; this is a bug, please report it with that file)", file=sys.stderr)
    sys.stderr.flush()
    return EXIT_CRASHED
