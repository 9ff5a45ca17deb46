"""A supervised pool of env worker processes over one shared-memory block.

    pool = HostEnvPool(spec, num_envs=16, num_workers=2, seed=0, num_groups=2)
    pool.arrays["action"][pool.group(0)] = a0; pool.send(0)     # workers of group 0 step
    ...                                                         # (infer group 1 meanwhile)
    pool.wait(0); obs0 = pool.arrays["obs"][pool.group(0)].copy()
    pool.close()

The batch is cut into ``num_groups`` contiguous groups (the flow's micro-batches) and
every worker holds a slice of each group, so all workers step one group together (every
core on it) while the caller works on another; commands and answers keep their order
per worker. Workers are `worker.py` run as scripts under
``spec.python`` (any interpreter with numpy and the simulator; no JAX needed).

Supervision: every answer is awaited with a deadline (``step_timeout_s``; a worker's
start with ``start_timeout_s``). A worker that crashed, answered an error or missed its
deadline is killed and replaced; the replacement ends its envs' episodes as truncations
and resets them (`worker.Slice.restart`). ``restarts`` counts the replacements. A
simulator that keeps failing stops the run: more than ``max_restarts`` replacements
within :data:`RESTART_WINDOW` steps raise, naming the last worker's exit code and its last
output lines, and so does a replacement that cannot start, instead of hanging.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from rlinf_jax.errors import BadInput

WORKER = Path(__file__).with_name("worker.py")
ALIGN = 64
# ``max_restarts`` counts the replacements within this many steps of a pool (every
# micro-batch stepped once is one step). A window, not a count over the run, so that a rare
# crash over a long run never adds up to a stop, while a crash loop (a replacement every
# few steps) stops within a few dozen steps.
RESTART_WINDOW = 100
# How long a worker that answered an error, or closed its pipe, is given to exit by itself
# before it is taken for hung (its exit code is part of every report).
EXIT_GRACE_S = 1.0


@dataclass(frozen=True)
class HostEnvSpec:
    """A host simulator's env as the pool runs it; sizes from the simulator itself."""

    env_id: str
    episode_length: int  # in base steps, as for the JAX envs
    action_repeat: int = 1
    reset_mode: str = "cached"
    python: str = sys.executable
    env_kwargs: dict = field(default_factory=dict)
    observation_size: int = 0
    action_size: int = 0
    has_success: bool = False  # the env reports info["success"] (or "is_success")
    # A camera ("" = none; robosuite's agentview, ...) rendered at image_size x image_size:
    # its uint8 image travels beside the state vector, [H, W, 3] in image_shape.
    camera: str = ""
    image_size: int = 0
    image_shape: tuple = ()
    # A simulator's asset folder supplied by the user (LIBERO's scene assets), "" = none.
    assets_dir: str = ""
    # The task's own instruction when the simulator states one (LIBERO), else "".
    instruction: str = ""
    # The CPU cores the workers are pinned to (() = not pinned).
    cpus: tuple = ()

    @property
    def time_limit(self) -> int:
        """Agent steps per episode: ``ceil(episode_length / action_repeat)`` (TimeLimit's)."""
        return math.ceil(self.episode_length / self.action_repeat)


def _layout(num_envs: int, obs: int, act: int, image_shape: tuple = ()) -> tuple[dict, int]:
    fields = {
        "obs": ("float32", (num_envs, obs)),
        "final_obs": ("float32", (num_envs, obs)),
        "action": ("float32", (num_envs, act)),
        "reward": ("float32", (num_envs,)),
        "done": ("float32", (num_envs,)),
        "truncated": ("float32", (num_envs,)),
        "episode_return": ("float32", (num_envs,)),
        "episode_length": ("int32", (num_envs,)),
        "episode_success": ("float32", (num_envs,)),
        "steps": ("int32", (num_envs,)),
        "running_return": ("float32", (num_envs,)),
        "running_length": ("int32", (num_envs,)),
        "running_success": ("float32", (num_envs,)),
        "episode_index": ("int64", (num_envs,)),
    }
    if image_shape:
        # Camera images as the simulator renders them (uint8), never converted per step.
        fields["image"] = ("uint8", (num_envs, *image_shape))
        fields["final_image"] = ("uint8", (num_envs, *image_shape))
    layout, offset = {}, 0
    for name, (dtype, shape) in fields.items():
        layout[name] = (offset, dtype, list(shape))
        offset += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // ALIGN) * ALIGN
    return layout, max(offset, ALIGN)


def _worker_env() -> dict:
    env = dict(os.environ)
    # The current directory on the worker's path too (a user's own registered env module),
    # and one thread each: the workers are the parallelism.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class _Worker:
    """One worker process, its pipes and its log file (stdout and stderr)."""

    def __init__(self, python: str, spec: dict):
        cmd_r, self.cmd_w = os.pipe()
        self.reply_r, reply_w = os.pipe()
        self.log = tempfile.TemporaryFile()
        self._buf = b""
        self.eof = False  # its answer pipe closed: it exited, or is exiting
        self.pending: list[int] = []  # groups whose commands await an answer, in order
        try:
            self.proc = subprocess.Popen(
                [python, str(WORKER), json.dumps({**spec, "cmd_fd": cmd_r, "reply_fd": reply_w})],
                pass_fds=(cmd_r, reply_w), stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                env=_worker_env(),
            )
        except OSError as e:
            for fd in (cmd_r, reply_w, self.cmd_w, self.reply_r):
                os.close(fd)
            self.log.close()
            raise BadInput(f"env.worker_python={python!r} cannot be started ({e.strerror}); name a Python interpreter") from None
        finally:
            if hasattr(self, "proc"):
                os.close(cmd_r)
                os.close(reply_w)

    def send(self, line: str) -> bool:
        try:
            os.write(self.cmd_w, (line + "\n").encode())
            return True
        except OSError:  # the worker is gone
            return False

    def read(self, deadline: float) -> str | None:
        """The worker's next answer line; None on exit or past ``deadline``."""
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.reply_r], [], [], left)[0]:
                return None
            chunk = os.read(self.reply_r, 65536)
            if not chunk:
                self.eof = True
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def log_tail(self, n: int = 400) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-n:]

    def last_lines(self, n: int = 3) -> str:
        """The last ``n`` lines the worker printed, on one line ("" when it printed none)."""
        lines = [line.strip() for line in self.log_tail(1000).splitlines() if line.strip()]
        return " | ".join(lines[-n:])[-500:]

    def exit_code(self) -> int | None:
        """The worker's exit code, after :data:`EXIT_GRACE_S` for one on its way out; None
        while it runs (hung)."""
        try:
            return self.proc.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            return None

    def close(self, grace: float = 2.0) -> None:
        if self.proc.poll() is None:
            self.send("close")
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self.cmd_w, self.reply_r):
            os.close(fd)
        self.log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.close()


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"died of {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            pass
    return f"exited with code {code}"


def _failure(worker: _Worker, line: str | None, no_answer: str) -> str:
    """What went wrong when ``worker`` gave ``line`` (None: nothing before its deadline or
    its exit) instead of its answer: the error it answered, its exit code (or
    ``no_answer``, how long it was waited for, when it hangs) and its last output lines.
    The caller kills it."""
    parts = []
    if line is not None:
        parts.append(line[4:] if line.startswith("err ") else f"unexpected answer {line!r}")
    # One that answered or closed its pipe is on its way out; one past its deadline is hung.
    code = worker.exit_code() if line is not None or worker.eof else worker.proc.poll()
    if code is not None:
        parts.append(_exit_text(code))
    elif line is None:
        parts.append(no_answer)
    tail = worker.last_lines()
    parts.append(f"its last output: {tail}" if tail else "no output")
    return "; ".join(parts)


def describe(spec: HostEnvSpec, timeout_s: float = 120.0) -> HostEnvSpec:
    """``spec`` with the simulator's observation and action sizes, asked of one worker
    (the parent may not even have the simulator installed). An unknown env id or an
    unsupported env is refused in one line."""
    w = _Worker(spec.python, {"describe_only": True, "env_id": spec.env_id, "env_kwargs": spec.env_kwargs,
                              "camera": spec.camera, "image_size": spec.image_size, "assets_dir": spec.assets_dir})
    try:
        line = w.read(time.monotonic() + timeout_s)
        if line is not None and line.startswith("ready "):
            reason = ""
        elif line is not None and line.startswith("err "):
            reason = line[4:]  # the simulator's own words; the traceback behind them is noise here
        else:
            reason = _failure(w, line, f"no answer in {timeout_s:g} s (env.worker_start_timeout_s={timeout_s:g})")
    finally:
        w.kill()
    if reason:
        if "No module named" in reason:
            reason += (" (install the simulator for that interpreter: pip install -e '.[gym]', or build a worker "
                       "environment with python -m rlinf_jax.envs.install NAME and set env.worker_python=NAME)")
        raise BadInput(f"env.name={spec.env_id!r} cannot be made by {spec.python}: {reason}")
    d = json.loads(line[len("ready "):])
    return HostEnvSpec(**{**spec.__dict__, "observation_size": d["observation_size"], "action_size": d["action_size"],
                                   "has_success": d["has_success"], "image_shape": tuple(d.get("image_shape", ())),
                                   "instruction": d.get("instruction", "")})


class HostEnvPool:
    def __init__(
        self,
        spec: HostEnvSpec,
        num_envs: int,
        num_workers: int,
        seed: int,
        num_groups: int = 1,
        episode_index: np.ndarray | None = None,
        step_timeout_s: float = 60.0,
        start_timeout_s: float = 120.0,
        first_env: int = 0,
        max_restarts: int = 10,
    ):
        if spec.observation_size < 1:
            spec = describe(spec, start_timeout_s)
        if num_envs % num_groups:
            raise BadInput(f"env.num_envs={num_envs} does not split into {num_groups} micro-batches")
        per = num_envs // num_groups
        if num_workers > per:
            raise BadInput(
                f"env.num_workers={num_workers} is more than the {per} envs of a micro-batch "
                f"(env.num_envs / flow.num_micro_batches); every worker holds a slice of each"
            )
        self.spec, self.num_envs, self.seed = spec, num_envs, int(seed)
        # The global index of env 0: seeds follow global indices, so a batch cut over the
        # processes of a multi-host run resets as it would in one pool.
        self.first_env = int(first_env)
        self.step_timeout_s, self.start_timeout_s = step_timeout_s, start_timeout_s
        self.restarts = 0
        self.num_groups = num_groups
        self.max_restarts = max_restarts
        self._waits = 0  # `wait` calls so far: num_groups of them make a step
        self._replaced_at: deque[int] = deque()  # the `_waits` of each replacement in the window
        self._groups = [slice(g * per, (g + 1) * per) for g in range(num_groups)]
        # Worker w serves slices[w][g] of group g.
        self.slices = [[] for _ in range(num_workers)]
        for g in range(num_groups):
            bounds = np.linspace(g * per, (g + 1) * per, num_workers + 1).round().astype(int)
            for w in range(num_workers):
                self.slices[w].append((int(bounds[w]), int(bounds[w + 1])))
        layout, size = _layout(num_envs, spec.observation_size, spec.action_size, spec.image_shape)
        self._shm = shared_memory.SharedMemory(create=True, size=size)
        self._layout, self._size = layout, size
        self.arrays = {
            k: np.ndarray(tuple(shape), np.dtype(dt), buffer=self._shm.buf, offset=off)
            for k, (off, dt, shape) in layout.items()
        }
        for a in self.arrays.values():
            a[...] = 0
        if episode_index is not None:
            self.arrays["episode_index"][:] = np.asarray(episode_index, np.int64)
        self.workers: list[_Worker | None] = [None] * len(self.slices)
        try:
            for w in range(len(self.slices)):  # started together, awaited in turn
                self.workers[w] = self._spawn(w, "resume")
            for w in range(len(self.slices)):
                self._await_ready(w)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------- processes
    def _spawn(self, w: int, mode: str) -> _Worker:
        s = self.spec
        return _Worker(s.python, {
            "env_id": s.env_id, "env_kwargs": s.env_kwargs, "camera": s.camera, "image_size": s.image_size,
            "assets_dir": s.assets_dir, "cpus": list(s.cpus), "seed": self.seed, "slices": self.slices[w],
            "action_repeat": s.action_repeat, "time_limit": s.time_limit, "reset_mode": s.reset_mode,
            "shm_name": self._shm.name, "shm_size": self._size, "layout": self._layout, "first_env": self.first_env,
            mode: True,
        })

    def _await_ready(self, w: int) -> None:
        worker = self.workers[w]
        line = worker.read(time.monotonic() + self.start_timeout_s)
        if line is None or not line.startswith("ready"):
            t = self.start_timeout_s
            reason = _failure(worker, line, f"no answer in {t:g} s (env.worker_start_timeout_s={t:g})")
            self.workers[w] = None
            worker.kill()
            raise BadInput(
                f"env worker {w} (env.name={self.spec.env_id!r}, envs {self._envs(w)}) did not start: {reason}"
            )

    def _replace(self, w: int, reason: str) -> None:
        """Kills worker ``w`` and starts a replacement that ends and resets its episodes;
        one replacement too many within :data:`RESTART_WINDOW` steps stops the run instead."""
        worker = self.workers[w]
        self.workers[w] = None
        worker.kill()
        self.restarts += 1
        self._replaced_at.append(self._waits)
        while self._replaced_at[0] <= self._waits - RESTART_WINDOW * self.num_groups:
            self._replaced_at.popleft()
        if len(self._replaced_at) > self.max_restarts:
            raise BadInput(
                f"env.name={self.spec.env_id!r} keeps failing: {len(self._replaced_at)} env worker replacements "
                f"within {RESTART_WINDOW} steps, more than env.max_worker_restarts={self.max_restarts}; the last, "
                f"worker {w} (envs {self._envs(w)}): {reason}. Fix the simulator or its env.gym_kwargs, or raise "
                "env.max_worker_restarts"
            )
        print(f"warning: env worker {w} (envs {self._envs(w)}) replaced: {reason}", file=sys.stderr)
        self.workers[w] = self._spawn(w, "restart")
        self._await_ready(w)

    def _envs(self, w: int) -> str:
        """Worker ``w``'s envs by global index."""
        f = self.first_env
        return ", ".join(f"{f + lo}-{f + hi - 1}" for lo, hi in self.slices[w])

    # ------------------------------------------------------------------ steps
    def group(self, g: int) -> slice:
        """The envs of micro-batch ``g``."""
        return self._groups[g]

    def send(self, g: int, command: str | None = None) -> None:
        """Starts ``command`` (default: step group ``g``) on every worker, for ``wait(g)``
        (actions already written)."""
        for worker in self.workers:
            # A worker that is gone fails this send and is replaced when `wait` reads its exit.
            worker.send(command or f"step {g}")
            worker.pending.append(g)

    def wait(self, g: int) -> None:
        """Until every worker has answered its command for group ``g``; replaces the ones
        that fail (a replacement ends and resets all its envs, so its other pending
        commands are answered by that too)."""
        self._waits += 1
        deadline = time.monotonic() + self.step_timeout_s
        for w in range(len(self.workers)):
            worker = self.workers[w]
            if g not in worker.pending:
                continue  # a replacement: its restart wrote this group's results
            if worker.pending[0] != g:
                raise RuntimeError(f"env worker {w}: waited for group {g} before group {worker.pending[0]}")
            line = worker.read(deadline)
            if line == "ok":
                worker.pending.pop(0)
                continue
            t = self.step_timeout_s
            self._replace(w, _failure(worker, line, f"no answer in {t:g} s (env.step_timeout_s={t:g})"))
            # A deadline missed by one worker is not charged to the next one's answer.
            deadline = max(deadline, time.monotonic() + self.step_timeout_s)

    def step(self, actions: np.ndarray | None = None) -> None:
        """Every env one step (all groups at once)."""
        if actions is not None:
            self.arrays["action"][:] = actions
        for g in range(self.num_groups):
            self.send(g)
        for g in range(self.num_groups):
            self.wait(g)

    def reset(self, seed: int) -> None:
        """Every env starts episode 0 under ``seed`` (evaluation draws a new seed each time)."""
        self.seed = int(seed)
        self.send(0, f"reset {self.seed}")
        self.wait(0)

    def close(self) -> None:
        """Stops every worker and frees the shared block; safe to call twice."""
        for w, worker in enumerate(getattr(self, "workers", [])):
            if worker is not None:
                worker.close()
                self.workers[w] = None
        shm = getattr(self, "_shm", None)
        if shm is not None:
            self.arrays = {}
            self._shm = None
            try:
                shm.close()
            except BufferError:  # a caller still holds a view; the mapping goes with the process
                pass
            shm.unlink()
