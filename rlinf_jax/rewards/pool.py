"""Run answer checkers on the host in worker processes, each call bounded in time.

Why processes, and why these: ``math-verify`` bounds its own work with ``signal.alarm``, which
only works in a process's main thread, so a thread pool either loses the timeout or raises.
Each worker here runs one call at a time in its main thread under our own ``setitimer`` alarm
(the *soft* timeout: the call is interrupted and the worker lives on; ``math-verify``'s alarms
are switched off so they cannot cancel ours). A call stuck where no signal reaches it (a C
loop, blocked signals) misses the parent's *hard* deadline, ``timeout_s + grace_s`` after it
was handed out; the parent then kills that one worker and starts another. A worker that dies
costs only its call. Every outcome is ``("ok", value)``, ``("error", message)`` or
``("timeout", None)``, so the caller can score failures as 0 and count them.

Workers are plain ``python -c`` subprocesses talking over pipes rather than ``multiprocessing``
children: a spawned child re-imports the parent's ``__main__`` module (the trainer, hence JAX)
and a forked one inherits JAX's threads, which can deadlock. These import only the checker.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from multiprocessing.connection import Connection, wait


class SoftTimeout(BaseException):
    """Raised inside a checker call by the alarm. A BaseException so that a checker's own
    ``except Exception`` cannot swallow it."""


# After the deadline the alarm repeats at this interval until the call is interrupted: a
# signal handler's exception raised inside a garbage-collector callback (JAX registers one)
# or a checker's bare ``except`` is swallowed there, and the call would otherwise run on.
_REPEAT_S = 0.05


def call_with_timeout(fn, args, timeout_s: float | None):
    """``fn(*args)`` in this thread as ``(status, value)``; never raises for what ``fn`` does.

    The alarm needs the main thread of the process; elsewhere the call runs unbounded. An alarm
    someone else had set (a test timeout, say) is put back afterwards with its remaining time.
    A call that passed its deadline is a timeout even if it then returned a value.
    """
    armed = bool(timeout_s) and threading.current_thread() is threading.main_thread()
    old_handler, old_timer, t0 = None, (0.0, 0.0), time.monotonic()
    fired = []

    def on_alarm(signum, frame):
        fired.append(True)
        raise SoftTimeout()

    try:
        if armed:
            old_handler = signal.signal(signal.SIGALRM, on_alarm)
            old_timer = signal.setitimer(signal.ITIMER_REAL, float(timeout_s), _REPEAT_S)
        try:
            value = fn(*args)
        finally:
            if armed:
                signal.setitimer(signal.ITIMER_REAL, 0)
        return ("timeout", None) if fired else ("ok", value)
    except SoftTimeout:
        return "timeout", None
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # a checker's SystemExit or library BaseException is its failure, not ours
        return "error", f"{type(e).__name__}: {e}".splitlines()[0][:300]
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler)
            if old_timer[0] > 0:  # an outer deadline that passed meanwhile fires right away
                signal.setitimer(signal.ITIMER_REAL, max(old_timer[0] - (time.monotonic() - t0), 1e-3), old_timer[1])


def _serve(read_fd: int, write_fd: int) -> None:
    """Worker main loop. In: ``(task_id, fn_blob, args, timeout_s)``. Out: ``("start", task_id)``
    once the checker is loaded (the parent's hard deadline runs from there, so start-up and
    imports are not charged to the call), then ``("done", task_id, status, value)``."""
    # Ctrl-C reaches the whole process group; the parent decides what stops, workers stay quiet.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rx, tx = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    sys.path[:] = rx.recv()  # the parent's import path, so its checkers unpickle here
    fns = {}
    while True:
        try:
            msg = rx.recv()
        except EOFError:
            return
        if msg is None:
            return
        tid, blob, args, timeout_s = msg
        try:
            if blob not in fns:
                fns[blob] = pickle.loads(blob)
        except Exception as e:
            tx.send(("done", tid, "error", f"cannot load the checker: {type(e).__name__}: {e}".splitlines()[0][:300]))
            continue
        tx.send(("start", tid))
        status, value = call_with_timeout(fns[blob], args, timeout_s)
        try:
            tx.send(("done", tid, status, value))
        except Exception as e:  # an unpicklable return value
            tx.send(("done", tid, "error", f"checker result not sendable: {type(e).__name__}"))


_WORKER_CODE = "import sys; from rlinf_jax.rewards.pool import _serve; _serve(int(sys.argv[1]), int(sys.argv[2]))"


def _reap(proc):
    if proc.poll() is None:
        proc.kill()


class _Worker:
    def __init__(self, preload: tuple[str, ...]):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # A missing preload module is the checker's problem to report, not the worker's to die of.
        code = f"import importlib\nfor m in {list(preload)!r}:\n    try: importlib.import_module(m)\n    except ImportError: pass\n"
        code += _WORKER_CODE
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w),
            stdin=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.tx = Connection(to_child_w, readable=False)
        self.rx = Connection(from_child_r, writable=False)
        self.tx.send(list(sys.path))
        # Reap the process even if the pool is never closed (a worker stuck in a call would
        # not notice its parent exit).
        weakref.finalize(self, _reap, self.proc)
        self.task: int | None = None
        self.deadline = 0.0

    def kill(self):
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):  # already gone, or stuck in the kernel: nothing more to do
            pass
        for c in (self.tx, self.rx):
            try:
                c.close()
            except OSError:
                pass

    def close(self):
        try:
            self.tx.send(None)  # ask it to exit; kill() below covers a worker that does not
            self.proc.wait(timeout=2)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        self.kill()


class CheckerPool:
    """``num_workers`` checker processes, started on first use and kept for later calls.

    ``preload``: modules each worker imports at start (the checker's library), so the first
    call's time is not spent importing. ``load_timeout_s`` bounds a worker's start-up plus
    loading the checker; ``timeout_s + grace_s`` bounds the call itself. Use as a context
    manager or call ``close()``: nothing closes it from ``__del__`` (a finaliser running at
    interpreter exit is where threads and pipes deadlock); a worker left behind is only
    killed by its ``weakref.finalize`` reaper.
    """

    def __init__(
        self, num_workers: int, timeout_s: float, grace_s: float = 2.0, preload=("math_verify",), load_timeout_s: float = 120.0
    ):
        if num_workers < 1:
            raise ValueError("a checker pool needs at least one worker")
        self.num_workers, self.timeout_s, self.grace_s = int(num_workers), float(timeout_s), float(grace_s)
        self.load_timeout_s = float(load_timeout_s)
        self.preload = tuple(preload)
        self.workers: list[_Worker] = []
        self.restarts = 0  # workers killed (hard timeout) or found dead, over the pool's life

    def _start(self):
        while len(self.workers) < self.num_workers:
            self.workers.append(_Worker(self.preload))

    def _replace(self, w: _Worker):
        w.kill()
        self.workers[self.workers.index(w)] = _Worker(self.preload)
        self.restarts += 1

    def map(self, fn, arg_tuples) -> list[tuple[str, object]]:
        """``[(status, value)]`` for ``fn(*args)`` of each ``args``, in order."""
        blob = pickle.dumps(fn)
        n = len(arg_tuples)
        results: list = [None] * n
        queue = deque(range(n))
        self._start()
        while queue or any(w.task is not None for w in self.workers):
            for w in list(self.workers):
                if w.task is None and queue:
                    i = queue.popleft()
                    try:
                        w.tx.send((i, blob, tuple(arg_tuples[i]), self.timeout_s))
                    except (OSError, ValueError):  # died while idle: the call fails, the worker is replaced
                        results[i] = ("error", "checker process died")
                        self._replace(w)
                        continue
                    # Until the worker says it started the call, allow for its start-up and imports.
                    w.task, w.deadline = i, time.monotonic() + self.load_timeout_s
            busy = [w for w in self.workers if w.task is not None]
            if not busy:
                continue
            wait_s = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready = wait([w.rx for w in busy], timeout=wait_s)
            for w in busy:
                if w.rx in ready:
                    try:
                        msg = w.rx.recv()
                        if msg[0] == "start":
                            w.deadline = time.monotonic() + self.timeout_s + self.grace_s
                        else:
                            _, tid, status, value = msg
                            results[tid] = (status, value)
                            w.task = None
                    except (EOFError, OSError):
                        results[w.task] = ("error", "checker process died")
                        self._replace(w)
                elif time.monotonic() >= w.deadline:
                    results[w.task] = ("timeout", None)
                    self._replace(w)
        return results

    def close(self):
        for w in self.workers:
            w.close()
        self.workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
