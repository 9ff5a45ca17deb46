"""Checkpoints on orbax's CheckpointManager: one step folder per save, last N kept.

Layout: ``<dir>/<step>/state`` (the array pytree, StandardSave) and ``<dir>/<step>/meta``
(a JSON dict). Orbax writes a step into ``<step>.orbax-checkpoint-tmp-<ts>/`` and renames
it when complete, so a crash mid-save leaves only a temp folder that every listing here
ignores: the newest *finished* step stays the one we resume from.

Each step folder also holds ``checksums.json``, written once the step is complete: two
32-bit checksums of every array (its elements as words, plain and position-weighted) and
a digest of the metadata. A restore recomputes them and refuses a checkpoint whose data
changed, naming the newest one that still verifies. A step without the file (saved
before checksums existed, or cut off between the save and the file) restores unverified.

Everything a user can get wrong (missing folder, corrupt files, a state that no longer
fits what was saved, a full disk) surfaces as a one-line ``BadInput``; nothing here has a
``__del__``: the CheckpointManager is closed by ``close`` (or the ``with`` block).

In a multi-host run every process calls `save`, `delete_after` and `restore` with the
same arguments: orbax writes each process's shards of global arrays and the metadata
from process 0. Where one process changes the folder for all (sweeping cut-off saves),
the others wait for it before they list the folder again.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

from rlinf_jax.errors import BadInput
from rlinf_jax.runtime.distributed import barrier, is_primary
from rlinf_jax.runtime.files import fs_error_text, is_user_fs_error, write_atomic

STATE, META = "state", "meta"
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's marker of a step folder still being written
CHECKSUMS = "checksums.json"
ORBAX_METADATA = "_CHECKPOINT_METADATA"  # written into every step folder orbax finished
_NO_EXPLANATION = object()  # a read whose failure needs no fallback named


@contextlib.contextmanager
def _listing_quietly():
    """Orbax warns once per numbered folder without its metadata file, each time it lists
    a folder (a dozen lines before our one line about a folder of such): what it would
    say is ours to say, so its warnings are held back while it lists and reads."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl_logger.setLevel(level)


def list_steps(directory: str | os.PathLike) -> list[int]:
    """Finished checkpoint steps in ``directory`` (temp folders of cut-off saves excluded)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    with _listing_quietly():
        return sorted(ocp.path.step.checkpoint_steps(directory))


def _key_str(key) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _stored_shape(leaf) -> tuple[int, ...]:
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        # A typed PRNG key is stored as its key data, which has trailing dims.
        return tuple(jax.eval_shape(jax.random.key_data, leaf).shape)
    return tuple(getattr(leaf, "shape", np.shape(leaf)))


def _flat_shapes(tree) -> dict[str, tuple[int, ...]]:
    """``a.b.0.c`` -> stored shape for every leaf; the paths orbax names its arrays by."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {".".join(_key_str(k) for k in path): _stored_shape(leaf) for path, leaf in leaves}


def _as_restorable(tree):
    # Orbax restores onto arrays and Python scalars but rejects NumPy scalar objects
    # (np.float32(1.0)); a 0-d array carries the same dtype and shape.
    return jax.tree.map(lambda x: np.asarray(x) if isinstance(x, np.generic) else x, tree)


def _placeholder(x):
    # Orbax hangs on zero-size arrays (MJX states are full of them: no contacts, no
    # tendons). They hold no data, so one element of the same dtype stands in for them and
    # the real empty array comes back from the restore target.
    size = int(np.prod(np.shape(x)))
    return np.zeros((1,), np.dtype(x.dtype)) if size == 0 and hasattr(x, "dtype") else x


def _is_empty(x) -> bool:
    return hasattr(x, "dtype") and int(np.prod(np.shape(x))) == 0


def _short(e: BaseException) -> str:
    # Tensorstore errors carry a kilobyte of JSON spec after the useful part.
    text = str(e).split(" [tensorstore_spec", 1)[0]
    text = " ".join(text.split())
    if len(text) > 240:
        text = text[:240] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# ---------------------------------------------------------------- checksums


def _words_np(x: np.ndarray) -> np.ndarray:
    """An array's elements as uint32 words (8-byte elements give two words each)."""
    x = np.ascontiguousarray(x)
    size = x.dtype.itemsize
    if x.dtype == np.bool_:
        return x.reshape(-1).astype(np.uint32)
    if size == 8:
        return x.reshape(-1).view(np.uint32)
    return x.reshape(-1).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[size]).astype(np.uint32)


def _checksum_np(x) -> tuple[int, int]:
    w = _words_np(np.asarray(x)).astype(np.uint64)
    index = (np.arange(1, w.size + 1, dtype=np.uint64) & np.uint64(0xFFFFFFFF))
    # uint64 sums wrap mod 2^64, and 2^32 divides 2^64: the low words are exact.
    plain = int(np.sum(w, dtype=np.uint64)) & 0xFFFFFFFF
    weighted = int(np.sum((w * index) & np.uint64(0xFFFFFFFF), dtype=np.uint64)) & 0xFFFFFFFF
    return plain, weighted


@jax.jit
def _checksum_device(x):
    if x.dtype == jnp.bool_:
        w = x.reshape(-1).astype(jnp.uint32)
    else:
        unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
        w = jax.lax.bitcast_convert_type(x, unsigned).reshape(-1).astype(jnp.uint32)
    index = jnp.arange(1, w.size + 1, dtype=jnp.uint32)
    # uint32 arithmetic wraps mod 2^32 and integer sums do not depend on their order, so the
    # result is the same however the array is sharded.
    return jnp.sum(w, dtype=jnp.uint32), jnp.sum(w * index, dtype=jnp.uint32)


def _checksum(x) -> tuple[int, int]:
    dtype = getattr(x, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)  # a typed key is stored as its key data
    if isinstance(x, jax.Array) and x.dtype.itemsize <= 4:
        plain, weighted = jax.device_get(_checksum_device(x))
        return int(plain), int(weighted)
    return _checksum_np(np.asarray(x))


def _flat_leaves(tree) -> dict[str, Any]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {".".join(_key_str(k) for k in path): leaf for path, leaf in leaves}


def checksums(state, meta: dict) -> dict:
    """What ``checksums.json`` holds for ``state`` and ``meta``."""
    arrays = {}
    for key, leaf in _flat_leaves(state).items():
        dtype = str(leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype)
        arrays[key] = {"shape": list(_stored_shape(leaf)), "dtype": dtype, "sums": list(_checksum(leaf))}
    meta_text = json.dumps(meta, sort_keys=True)
    return {"version": 1, "arrays": arrays, "meta": hashlib.sha256(meta_text.encode()).hexdigest()}


def _mismatch(expected: dict, state, meta: dict) -> str | None:
    """The first difference between a restored ``state`` / ``meta`` and their checksums."""
    got = _flat_leaves(state)
    for key, want in expected["arrays"].items():
        if int(np.prod(want["shape"])) == 0:
            continue  # empty arrays are stored as placeholders and hold no data
        if key not in got:
            return f"{key} is missing"
        if list(_checksum(got[key])) != want["sums"]:
            return f"the data of {key} changed"
    if hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest() != expected["meta"]:
        return "its metadata changed"
    return None



_SETTLE_S, _SETTLE_MAX_S = 0.3, 3.0
_THREADS_MAX_S = 20.0  # how long a failed save's background threads get to end


def _join_new_threads(before: set[threading.Thread], timeout_s: float) -> None:
    """Waits (up to ``timeout_s`` in all) until the threads started since ``before`` have
    ended: a failed save's writers, which would otherwise print their own failures later,
    or write into the temporary folder we are about to remove. Listed again after each
    join, since a writer may start a thread of its own (``asyncio.to_thread``) late."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [t for t in threading.enumerate() if t not in before and t is not threading.current_thread()]
        if not alive:
            return
        alive[0].join(timeout=max(0.0, deadline - time.monotonic()))


@contextlib.contextmanager
def _quiet_if_failed(settle_threads: bool = False):
    """Drops what a failed read or save of orbax's prints to stderr.

    When one array of a damaged checkpoint fails to read, or a save is cut off by Ctrl-C
    or a full disk, orbax raises and closes its event loop while tensorstore's other
    reads and writes, and orbax's own background threads (``write_metadata_after_commits``),
    are still running; each of those then fails on its own and prints the traceback itself
    (from its own threads, past Python's hooks: "Event loop is closed", "cannot schedule
    new futures after shutdown", "No space left on device"), and the abandoned asyncio
    tasks log "Task exception was never retrieved" when collected: dozens of tracebacks
    around our one ``error:`` line, which already names the failure. So while orbax works,
    the process's stderr (file descriptor 2) goes to a file. After a success what was
    written is passed on; after a failure the stragglers are given time to end (with
    ``settle_threads``, the threads started inside are joined; then until the file stops
    growing, at most a few seconds), the abandoned tasks are collected, and what was
    written is dropped.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    failed = False
    before = set(threading.enumerate())
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            if failed:
                if settle_threads:
                    _join_new_threads(before, _THREADS_MAX_S)
                size, t0 = -1, time.monotonic()
                while os.fstat(captured.fileno()).st_size != size and time.monotonic() - t0 < _SETTLE_MAX_S:
                    size = os.fstat(captured.fileno()).st_size
                    time.sleep(_SETTLE_S)
                gc.collect()
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if not failed:
                captured.seek(0)
                text = captured.read().decode(errors="replace")
                if text:
                    sys.stderr.write(text)
                    sys.stderr.flush()


class ResumePoint(NamedTuple):
    """A checkpoint to resume from; unpacks as ``directory, step``."""

    directory: Path
    step: int

    @property
    def path(self) -> Path:
        return self.directory / str(self.step)

    def looks_saved(self) -> bool:
        """Whether the step folder holds the metadata file every finished save writes (a
        numbered folder of something else does not); a restore still verifies it."""
        return (self.path / ORBAX_METADATA).is_file()


class Checkpointer:
    """Saves and restores ``(state pytree, meta dict)`` per step in ``directory``.

    Reading never creates ``directory``; the first ``save`` does.
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3):
        if int(keep) < 1:
            raise BadInput(f"runner.keep_checkpoints={keep} must be >= 1")
        self.directory = Path(directory).absolute()
        self.keep = int(keep)
        self._manager: ocp.CheckpointManager | None = None
        self._swept = False

    # ------------------------------------------------------------------ plumbing

    def _mngr(self) -> ocp.CheckpointManager:
        if self._manager is None:
            registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
            # Registering handlers up front (rather than learning them from a first
            # save) lets a fresh process read a checkpoint's metadata before restoring.
            state_handler, meta_handler = ocp.StandardCheckpointHandler(), ocp.JsonCheckpointHandler()
            registry.add(STATE, ocp.args.StandardSave, state_handler)
            registry.add(STATE, ocp.args.StandardRestore, state_handler)
            registry.add(META, ocp.args.JsonSave, meta_handler)
            registry.add(META, ocp.args.JsonRestore, meta_handler)
            options = ocp.CheckpointManagerOptions(
                preservation_policy=ocm.LatestN(self.keep),
                create=False,  # we make the folder on save, so reads leave no empty dirs behind
                # Not here: a reader (resume from another run's folder) must never delete
                # a save that a live writer has in flight. save() sweeps instead.
                cleanup_tmp_directories=False,
                # Synchronous: save() returns with the step renamed into place.
                enable_async_checkpointing=False,
            )
            with _listing_quietly():  # the manager lists the folder as it starts
                self._manager = ocp.CheckpointManager(self.directory, options=options, handler_registry=registry)
        return self._manager

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ listing

    def all_steps(self) -> list[int]:
        return list_steps(self.directory)

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def step_path(self, step: int) -> Path:
        return self.directory / str(int(step))

    # ------------------------------------------------------------------ save

    def save(self, step: int, state: Any, meta: dict | None = None) -> Path:
        """Writes ``state`` (a pytree of arrays / scalars) and ``meta`` (JSON-able) as ``step``.

        Returns once the step folder is complete and in place. Saving a step that
        already exists replaces it: after a resume from an earlier step the new
        lineage wins. Only the newest ``keep`` steps are kept.
        """
        step = int(step)
        meta = {} if meta is None else dict(meta)
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as e:
            raise TypeError(f"checkpoint meta must be JSON-serializable: {e}") from None
        if not jax.tree_util.tree_leaves(state):
            # Orbax fails on an empty tree and leaves its background machinery hanging.
            raise ValueError("cannot checkpoint an empty state pytree")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BadInput(f"cannot create checkpoint folder {self.directory}: {e.strerror or e}") from None
        if not self._swept:
            self._sweep_partial_saves()
        mngr = self._mngr()
        barrier(f"rlinf_checkpoint_save_{step}")  # every process lists the same folder
        mngr.reload()  # another Checkpointer may have written here since we last looked
        exists = step in mngr.all_steps()
        barrier(f"rlinf_checkpoint_listed_{step}")  # ... before process 0 deletes from it
        if exists:
            mngr.delete(step)
        try:
            with _quiet_if_failed(settle_threads=True):
                try:
                    mngr.save(
                        step,
                        args=ocp.args.Composite(
                            **{
                                STATE: ocp.args.StandardSave(jax.tree.map(_placeholder, state)),
                                META: ocp.args.JsonSave(meta),
                            }
                        ),
                        force=True,
                    )
                    mngr.wait_until_finished()
                    sums = checksums(state, meta)
                    if is_primary():
                        write_atomic(self.step_path(step) / CHECKSUMS, json.dumps(sums))
                except BaseException as failure:
                    # The manager of a save cut off half-way is closed (its threads
                    # joined by the context) and a fresh one made for what follows. The
                    # failure's frames let go of it and of its abandoned asyncio tasks, so
                    # that the context collects them while their complaints are dropped,
                    # not when the exception is finally released, past our error line.
                    self._abandon_manager()
                    mngr = None
                    traceback.clear_frames(failure.__traceback__)
                    raise
            barrier(f"rlinf_checkpoint_summed_{step}")
        except BaseException as e:
            # A save cut off by Ctrl-C, a full disk or anything else leaves no step behind
            # that a resume could take for complete: the previous one stays the latest.
            self._drop_unfinished(step)
            if is_user_fs_error(e):
                prev = [s for s in self.all_steps() if s != step]
                kept = f"the latest complete checkpoint is step {prev[-1]}" if prev else "no earlier checkpoint exists"
                raise BadInput(
                    f"cannot write checkpoint {step} in {self.directory} ({fs_error_text(e)}); {kept}; free space (or "
                    "fix the folder's permissions) and continue with runner.resume=auto"
                ) from None
            raise
        return self.step_path(step)

    def _abandon_manager(self) -> None:
        manager, self._manager = self._manager, None
        if manager is not None:
            try:
                manager.close()
            except BaseException:
                pass  # it failed mid-save: what it says is the failure we already report

    def _drop_unfinished(self, step: int) -> None:
        if not is_primary():
            return
        for p in self.directory.glob(f"*{TMP_SUFFIX}*"):
            shutil.rmtree(p, ignore_errors=True)
        path = self.step_path(step)
        if path.is_dir() and not (path / CHECKSUMS).is_file():
            shutil.rmtree(path, ignore_errors=True)

    def _sweep_partial_saves(self) -> None:
        # Temp folders of saves cut off by a crash: never valid, only disk. We are the
        # writer of this folder now (orbax is not multi-writer safe in any case).
        if is_primary():
            for p in self.directory.glob(f"*{TMP_SUFFIX}*"):
                shutil.rmtree(p, ignore_errors=True)
        barrier("rlinf_checkpoint_sweep")
        self._swept = True

    def delete_after(self, step: int) -> list[int]:
        """Deletes steps newer than ``step`` (the future of a run rewound to ``step``)."""
        barrier(f"rlinf_checkpoint_delete_after_{step}")
        doomed = [s for s in self.all_steps() if s > step]
        barrier(f"rlinf_checkpoint_listed_after_{step}")
        if doomed:
            mngr = self._mngr()
            mngr.reload()
            for s in doomed:
                mngr.delete(s)
            mngr.wait_until_finished()
        return doomed

    # ------------------------------------------------------------------ restore

    def restore(self, step: int | None, target: Any) -> tuple[Any, dict]:
        """Reads ``step`` (None: the latest) onto ``target``'s structure, shapes and shardings.

        ``target`` is a pytree like the saved state (real arrays or
        ``jax.ShapeDtypeStruct``s), or None to read the saved tree as nested dicts of
        host arrays (for inspection); returns ``(state, meta)``.
        """
        if not self.directory.is_dir():
            raise BadInput(f"checkpoint directory {self.directory} does not exist; check runner.resume")
        steps = self.all_steps()
        if not steps:
            raise BadInput(f"no checkpoint in {self.directory}; it holds no finished step folder")
        step = steps[-1] if step is None else int(step)
        if step not in steps:
            raise BadInput(
                f"no checkpoint for step {step} in {self.directory}; available steps: {', '.join(map(str, steps))}"
            )
        state, meta = self._read(step, steps, target)
        problem = self._verify(step, state, meta)
        if problem is not None:
            raise BadInput(
                f"checkpoint {self.step_path(step)} fails its checksums ({problem}); {self._fallback(step, steps, target)}"
            )
        return state, meta

    def _read(self, step: int, steps: list[int], target: Any, explain: bool = True) -> tuple[Any, dict]:
        target = _as_restorable(target)
        empty_target = target
        if target is not None:
            target = jax.tree.map(_placeholder, target)
        mngr = self._mngr()
        with _listing_quietly():
            mngr.reload()
        try:
            with _quiet_if_failed(), _listing_quietly():  # reading the metadata opens every array too
                saved = mngr.item_metadata(step)[STATE]
        except Exception as e:  # orbax raises anything from JSONDecodeError to KeyError
            raise self._corrupt(step, steps, e, target if explain else _NO_EXPLANATION) from e
        if target is not None and saved is not None and getattr(saved, "tree", None) is not None:
            self._check_fits(step, saved.tree, target)
        try:
            with _quiet_if_failed():
                restored = mngr.restore(
                    step,
                    args=ocp.args.Composite(**{STATE: ocp.args.StandardRestore(target), META: ocp.args.JsonRestore()}),
                )
        except Exception as e:
            raise self._corrupt(step, steps, e, target if explain else _NO_EXPLANATION) from e
        state = restored[STATE]
        if empty_target is not None:
            state = jax.tree.map(
                lambda t, r: jax.numpy.zeros(t.shape, t.dtype) if _is_empty(t) else r, empty_target, state
            )
        return state, dict(restored[META] or {})

    def read_meta(self, step: int) -> dict:
        """The metadata saved with ``step``, without reading its arrays: what a run checks of
        a checkpoint before restoring it. Unverified, and {} when it cannot be read (the
        restore then says what is wrong)."""
        mngr = self._mngr()
        try:
            with _quiet_if_failed(), _listing_quietly():
                mngr.reload()
                restored = mngr.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
        except Exception:  # orbax raises anything from JSONDecodeError to KeyError
            return {}
        meta = restored[META]
        return dict(meta) if isinstance(meta, dict) else {}

    def _verify(self, step: int, state: Any, meta: dict) -> str | None:
        """None when ``step`` has no checksums (unverifiable) or they match."""
        path = self.step_path(step) / CHECKSUMS
        if not path.is_file():
            return None
        try:
            expected = json.loads(path.read_text())
            expected["arrays"], expected["meta"]
        except (OSError, ValueError, KeyError, TypeError):
            return f"{CHECKSUMS} is unreadable"
        return _mismatch(expected, state, meta)

    def verified(self, step: int, target: Any) -> bool:
        """Whether ``step`` restores onto ``target`` and matches its checksums."""
        try:
            state, meta = self._read(step, self.all_steps(), target, explain=False)
        except BadInput:
            return False
        return (self.step_path(step) / CHECKSUMS).is_file() and self._verify(step, state, meta) is None

    def _fallback(self, step: int, steps: list[int], target: Any) -> str:
        for other in sorted((s for s in steps if s < step), reverse=True):
            if self.verified(other, target):
                return (
                    f"the newest checkpoint that verifies is step {other} ({self.step_path(other)}): point "
                    "runner.resume at it, or delete the later step folders and use runner.resume=auto"
                )
        return "no earlier checkpoint in that folder verifies; start a new run (another runner.experiment_name)"

    def _corrupt(self, step: int, steps: list[int], e: BaseException, target: Any) -> BadInput:
        fallback = "" if target is _NO_EXPLANATION else f"; {self._fallback(step, steps, target)}"
        return BadInput(f"checkpoint {self.step_path(step)} is corrupt or unreadable ({_short(e)}){fallback}")

    def _check_fits(self, step: int, saved_tree, target) -> None:
        saved, wanted = _flat_shapes(saved_tree), _flat_shapes(target)
        problems = []
        for key, shape in wanted.items():
            if key not in saved:
                problems.append(f"{key} (shape {shape}) is not in the checkpoint")
            elif saved[key] != shape:
                problems.append(f"{key} has shape {saved[key]} in the checkpoint but {shape} in the current state")
        problems += [f"the checkpoint has {k} (shape {s}) that the current state lacks" for k, s in saved.items() if k not in wanted]
        if problems:
            more = f" (and {len(problems) - 1} more differences)" if len(problems) > 1 else ""
            raise BadInput(
                f"checkpoint {self.step_path(step)} does not fit the current state: {problems[0]}{more}; "
                "was it saved with a different config?"
            )


def restore_checkpoint(point: ResumePoint | str | os.PathLike, target: Any, keep: int = 3) -> tuple[Any, dict]:
    """Restores a ``ResumePoint`` or a step folder path onto ``target``; returns (state, meta)."""
    if not isinstance(point, ResumePoint):
        path = Path(point)
        if not path.name.isdigit():
            raise BadInput(f"{path} is not a checkpoint step folder (expected .../checkpoints/<step>)")
        point = ResumePoint(path.parent, int(path.name))
    with Checkpointer(point.directory, keep=keep) as ckpt:
        return ckpt.restore(point.step, target)


def resolve_resume(cfg, run_dir) -> ResumePoint | None:
    """What ``runner.resume`` points at, as ``(checkpoints dir, step)``; None = fresh start.

    ``none``: None. ``auto``: the latest checkpoint of this run dir, or None when it has
    none yet. A path: a step folder (``.../checkpoints/100``), a checkpoints folder (its
    latest step) or a run folder holding ``checkpoints/`` (its latest step).
    """
    resume = cfg.runner.resume
    if resume == "none":
        return None
    if resume == "auto":
        steps = list_steps(run_dir.checkpoints)
        return ResumePoint(Path(run_dir.checkpoints).absolute(), steps[-1]) if steps else None

    return find_checkpoint(resume, "runner.resume")


def find_checkpoint(path: str | os.PathLike, what: str) -> ResumePoint:
    """The checkpoint a user path means: a step folder (``.../checkpoints/100``), a
    checkpoints folder (its latest step) or a run folder holding ``checkpoints/`` (its
    latest step). ``what`` names the setting in error messages."""
    given = str(path)
    path = Path(path).absolute()
    if not path.exists():
        raise BadInput(f"{what}={given!r}: no such path; give a run folder or a checkpoint path")
    if path.name.isdigit() and int(path.name) in list_steps(path.parent):
        return ResumePoint(path.parent, int(path.name))
    for candidate in (path, path / "checkpoints"):
        steps = list_steps(candidate)
        if steps:
            return ResumePoint(candidate, steps[-1])
    raise BadInput(
        f"{what}={given!r} holds no finished checkpoint; point it at a step folder "
        "(.../checkpoints/<step>), a checkpoints folder, or a run folder"
    )
