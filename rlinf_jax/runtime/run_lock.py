"""One writer per run folder: an exclusive lock that a training run holds for its whole life.

``<run dir>/run.lock`` names its holder (pid, host, start time, command line) and carries a
POSIX record lock (``fcntl.lockf``). The kernel drops such a lock when its process ends,
however it ends (exit, crash, SIGKILL), so a lock file left by a dead run is stale by
construction: the next run takes it over without asking anyone to delete anything. A
record lock, unlike ``flock``, is not inherited by forked children, so a worker process
that outlives a killed run cannot keep its folder locked; it works on NFS too.

A second writer (two identical commands, or ``runner.resume=auto`` while the first run is
alive) gets one ``error:`` line naming the holder, before it reads a checkpoint that the
holder may be rotating away. Readers (`evaluate`, `read_metrics`) never take the lock.

Record locks belong to the process, and closing *any* descriptor of the file releases
them, so this process opens the file once and refuses a second holder itself (two runs
into one folder from one notebook) before the kernel would wave it through.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import sys
from pathlib import Path

from rlinf_jax.errors import BadInput
from rlinf_jax.runtime.distributed import from_primary

LOCK_FILE = "run.lock"

_held: set[str] = set()  # run folders this process holds, as absolute paths


def _holder_text(info: dict) -> str:
    """The holder of a lock in a few words, for the error line."""
    if not info:
        return "another process (it is starting: its details are not written yet)"
    where = f"pid {info.get('pid', '?')} on host {info.get('host', '?')}"
    since = f", since {info['started']}" if info.get("started") else ""
    command = " ".join(str(info.get("command") or "").split())  # one line, whatever was typed
    command = f": {command[:160]}{'...' if len(command) > 160 else ''}" if command else ""
    return f"{where}{since}{command}"


def read_holder(run_dir: str | os.PathLike) -> dict:
    """What ``run.lock`` says of its holder ({} when there is no file or it is empty). The
    file outlives a killed holder: whether it is still held, only trying the lock tells."""
    try:
        text = (Path(run_dir) / LOCK_FILE).read_text()
        info = json.loads(text)
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


class RunLock:
    """The exclusive lock of ``run_dir`` (a context manager; `release` on every path out).

    ``enabled=False`` (the non-primary processes of a multi-host run: process 0 holds the
    lock for the job) makes it a no-op. Acquiring may create the folder; releasing removes
    the lock file and any folder the acquire created that is still empty, so a run refused
    after the lock leaves no trace.
    """

    def __init__(self, run_dir: str | os.PathLike, enabled: bool = True):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.enabled = enabled
        self._fd: int | None = None
        self._holding = False
        self._created: list[Path] = []
        self._key = os.path.abspath(self.run_dir)

    def __enter__(self) -> RunLock:
        if not self._holding:  # `with lock_run_folder(...)` enters a lock already held
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    # ------------------------------------------------------------------ acquire
    def acquire(self) -> None:
        if not self.enabled or self._holding:
            return
        if self._key in _held:
            raise BadInput(
                f"run folder {self.run_dir} is in use by another run of this process that has not ended; wait "
                "for it, or choose another runner.experiment_name"
            )
        self._make_folder()
        try:
            self._fd = self._lock_file()
        except BaseException:
            self._remove_created()
            raise
        _held.add(self._key)
        self._holding = True

    def _make_folder(self) -> None:
        missing = []
        for d in (self.run_dir, *self.run_dir.parents):
            if d.exists():
                break
            missing.append(d)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise BadInput(
                f"cannot create run directory {self.run_dir}: a file is in the way; change runner.output_dir or "
                "runner.experiment_name"
            ) from None
        except OSError as e:
            raise BadInput(f"cannot create run directory {self.run_dir}: {e.strerror or e}; change runner.output_dir") from None
        self._created = missing  # deepest first: the order to remove them in

    def _lock_file(self) -> int | None:
        # Between our open and our lock, the holder may release (unlinking the file) and a
        # third run create a new one: a lock on the unlinked inode would guard nothing, so
        # check that the path still names the file we locked, and retry when it does not.
        for _ in range(10):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as e:
                raise BadInput(f"cannot write the lock file {self.path}: {e.strerror or e}; fix the run folder's permissions") from None
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EACCES, errno.EAGAIN):
                    raise BadInput(
                        f"run folder {self.run_dir} is in use by {_holder_text(read_holder(self.run_dir))}; wait for "
                        "that run to end (or stop it), or choose another runner.experiment_name"
                    ) from None
                if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    print(
                        f"warning: the file system of {self.run_dir} does not support locks ({e.strerror}); nothing "
                        "stops a second run from writing into this folder",
                        file=sys.stderr,
                    )
                    return None
                raise
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._write_holder(fd)
                return fd
            os.close(fd)
        raise BadInput(f"could not lock run folder {self.run_dir}: its lock file keeps changing; is another run starting?")

    @staticmethod
    def _write_holder(fd: int) -> None:
        # As typed (`python -m rlinf_jax.train ...`), not argv's resolved script path.
        argv = getattr(sys, "orig_argv", None) or sys.argv
        command = " ".join([os.path.basename(argv[0]), *argv[1:]]) if argv else ""
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": command[:1000],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)

    # ------------------------------------------------------------------ release
    def release(self) -> None:
        if not self._holding:
            self._remove_created()
            return
        self._holding = False
        _held.discard(self._key)
        if self._fd is not None:
            # Unlinked while still held: a run waiting on this file finds it gone and
            # creates a fresh one rather than locking a file nobody can see.
            try:
                self.path.unlink()
            except OSError:
                pass
            os.close(self._fd)  # drops the record lock
            self._fd = None
        self._remove_created()

    def _remove_created(self) -> None:
        for d in self._created:
            try:
                d.rmdir()  # only when empty: a run that wrote anything keeps its folder
            except OSError:
                break
        self._created = []


def lock_run_folder(run_dir: str | os.PathLike, primary: bool = True) -> RunLock:
    """The acquired lock of ``run_dir``. In a multi-host run process 0 holds it for the job,
    and every process raises the same `BadInput` when it cannot be had."""
    lock = RunLock(run_dir, enabled=primary)
    problem = ""
    try:
        lock.acquire()
    except BadInput as e:
        problem = str(e)
    problem = from_primary("run_lock", problem)
    if problem:
        lock.release()
        raise BadInput(problem)
    return lock
