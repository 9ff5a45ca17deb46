"""The host loop every training run shares: resume, chunks of iterations, eval, logs, checkpoints.

A run's trainer (embodied PPO, SFT, reasoning RL) only knows how to run iterations and
evaluations; this loop decides when. It wakes at chunk boundaries, which sit at
multiples of the log / eval / save intervals counted from step 0, so the boundaries do
not depend on where a run was resumed: a killed-and-resumed run ends with exactly the
numbers of an uninterrupted one. What a resume rewinds (records logged and checkpoints
saved after the resume point) is dropped before the run goes on.

In a multi-host run every process runs this loop in the same order (whatever touches a
jitted program or a checkpoint is collective); only process 0 writes the run directory's
files for people (config.yaml, placement.json, metrics.jsonl, TensorBoard) and shows the
progress bar. Checkpoints are saved and restored by all processes together.

The trainer is any `rlinf_jax.flow.trainer.Trainer`. Each task subclasses `HostLoop` for
what is its own: how a chunk is run and reported, what is logged at step 0, which eval
metric is the headline, what placement.json says. Ctrl-C propagates as
`KeyboardInterrupt` after the logs are closed; the CLI turns it into exit code 130 (and
`TrainingDiverged` into 1).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import jax

from rlinf_jax.config import config_to_yaml
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.flow import seeds
from rlinf_jax.flow.progress import ProgressBar
from rlinf_jax.flow.trainer import Trainer
from rlinf_jax.runtime import Checkpointer, MetricsLogger, RunDir, list_steps, read_metrics, resolve_resume
from rlinf_jax.runtime.checkpoint import ResumePoint
from rlinf_jax.runtime.distributed import barrier, heartbeat, is_multiprocess, is_primary
from rlinf_jax.runtime.files import fs_error_text, is_user_fs_error, write_atomic
from rlinf_jax.runtime.run_lock import lock_run_folder
from rlinf_jax.sharding.mesh import fetch, spans_all_processes


class TrainingDiverged(RuntimeError):
    """Updates kept producing non-finite losses or gradients; the run stopped."""


def next_boundary(step: int, cfg: Config) -> int:
    """The next step at which the host has something to do (log, eval, save or stop)."""
    r = cfg.runner
    candidates = [r.max_steps]
    for interval in (r.log_interval, r.eval_interval, r.save_interval):
        if interval > 0:
            candidates.append((step // interval + 1) * interval)
    return min(candidates)


def due(step: int, interval: int, final: bool) -> bool:
    return final or (interval > 0 and step % interval == 0)


def enable_compilation_cache(directory: str) -> None:
    if directory:
        jax.config.update("jax_compilation_cache_dir", str(Path(directory).expanduser()))
        # Every program, the eager ops of model and optimiser init too: ~90 of them at tens
        # of ms each are seconds of every start, and loading one costs a few ms.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def eval_key(cfg: Config, step: int):
    """The evaluation's key at ``step``: the same whatever the chunking or resume point
    (and at every step with ``runner.eval_episodes=fixed``)."""
    return seeds.eval_key(cfg.runner.seed, seeds.eval_step(cfg.runner, step))


def checkpoint_view(snapshot):
    """What a checkpoint holds of ``snapshot`` (and what a restore reads into).

    One process: the snapshot itself. Several: orbax writes an array that spans every
    process shard by shard from all of them, so no host ever holds the whole state; an
    array that only some processes hold (a component placed on some hosts) is one orbax
    cannot write, and it goes through the host instead.
    """
    if not is_multiprocess():
        return snapshot
    leaves, treedef = jax.tree.flatten(snapshot)
    partial = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not spans_all_processes(x)]
    for i, value in zip(partial, fetch([leaves[i] for i in partial])):
        leaves[i] = value
    return jax.tree.unflatten(treedef, leaves)


def checkpoint_state(trainer, state):
    """The arrays a checkpoint of ``state`` writes (host copies on one process)."""
    snapshot = trainer.snapshot(state)
    return checkpoint_view(snapshot) if is_multiprocess() else jax.device_get(snapshot)


@dataclass
class NothingToDo:
    """What a run returns when its checkpoint is already at (or past) ``runner.max_steps``:
    found before anything is built or compiled."""

    run_dir: Path
    step: int
    max_steps: int

    def text(self) -> str:
        return (
            f"nothing to do: the checkpoint of {self.run_dir} is at step {self.step} and runner.max_steps="
            f"{self.max_steps}; raise runner.max_steps to train further"
        )


@dataclass
class OpenRun:
    """A run folder claimed for writing: where to resume from, or that there is nothing to do."""

    run_dir: RunDir
    resume_path: ResumePoint | None
    done: NothingToDo | None


@contextlib.contextmanager
def open_run_dir(cfg: Config) -> Iterator[OpenRun]:
    """The run directory, locked for this run's life, and the checkpoint ``runner.resume``
    points at (None: fresh start).

    The lock comes first: a second writer is refused before it reads checkpoints that the
    holder may be rotating away. Then, before any trainer is built, a fresh start is
    checked not to overwrite a run, and a resume that has nothing left to do says so.
    """
    run_dir = RunDir.from_config(cfg)
    lock = lock_run_folder(run_dir.path, primary=is_primary())
    try:
        resume_path = resolve_resume(cfg, run_dir)
        if resume_path is None and cfg.runner.resume == "none" and not cfg.runner.resume_overwrite:
            if run_dir.has_checkpoints():
                raise BadInput(
                    f"{run_dir.path} already holds checkpoints; pass runner.resume=auto to continue that run "
                    "or choose another runner.experiment_name"
                )
            if run_dir.metrics_jsonl.is_file() and read_metrics(run_dir.metrics_jsonl):
                raise BadInput(
                    f"{run_dir.path} holds the metrics of a run that saved no checkpoint; runner.resume=auto starts "
                    "it over (its records are dropped), or choose another runner.experiment_name"
                )
        done = None
        if resume_path is not None and resume_path.step >= cfg.runner.max_steps and resume_path.looks_saved():
            done = NothingToDo(run_dir.path, resume_path.step, cfg.runner.max_steps)
        yield OpenRun(run_dir, resume_path, done)
    finally:
        lock.release()


def refuse_to_destroy(cfg: Config, run_dir: RunDir, resume_path: ResumePoint | None, resumed_from: int | None) -> None:
    """What a resume would delete of the run folder it writes to, refused unless
    ``runner.resume_overwrite``: checkpoints (and logged steps) after a resume point the user
    named in this run, or a run folder holding another run's checkpoints. ``auto`` rewinds
    only the tail a crash left after the latest checkpoint."""
    if resume_path is None or cfg.runner.resume == "auto" or cfg.runner.resume_overwrite:
        return
    own = list_steps(run_dir.checkpoints)
    same_run = Path(resume_path.directory).absolute() == run_dir.checkpoints.absolute()
    later = [s for s in own if s > resumed_from] if same_run else own
    if later:
        what = f"checkpoints after step {resumed_from} ({', '.join(map(str, later))})" if same_run else (
            f"the checkpoints of another run ({', '.join(map(str, later))})"
        )
        raise BadInput(
            f"runner.resume={cfg.runner.resume} would delete {what} in {run_dir.path}; choose another "
            "runner.experiment_name, or pass runner.resume_overwrite=true to replace them"
        )


@dataclass
class LoopResult:
    run_dir: Path
    step: int  # where the run stopped
    start_step: int  # where this invocation started (the resume point, or 0)
    resumed_from: int | None
    train_sec: float  # in chunks of iterations, evaluations and saves excluded
    compile_sec: float
    first: dict | None  # the step-0 record (None on a resumed run)
    last_eval: dict | None  # the last evaluation's metrics


class HostLoop:
    """Runs ``trainer`` under ``cfg``'s cadence; subclasses supply what their task adds."""

    label: ClassVar[str] = "train"  # the progress bar's
    bar_info: ClassVar[str] = "compiling..."  # the bar's text before the first chunk
    shown: ClassVar[dict[str, str]] = {}  # metric -> bar label
    eval_metric: ClassVar[str] = ""  # an evaluation record always gets logged when it holds this
    unit: ClassVar[str] = "iterations"  # what the divergence error counts
    diverged_hint: ClassVar[str] = "Lower actor.optim.lr"

    def __init__(self, cfg: Config, trainer: Trainer, run_dir: RunDir, resume_path: ResumePoint | None, console=None):
        self.cfg, self.trainer, self.run_dir, self.resume_path = cfg, trainer, run_dir, resume_path
        self.console = console
        self.primary = is_primary()
        self.compile_sec = 0.0
        # The newest checkpoint saved while the run was healthy: what a divergence names.
        self.last_good: Path | None = None

    # ------------------------------------------------------------------ what subclasses add
    def placement_info(self, metrics: dict | None = None) -> dict | None:
        """What placement.json holds (None: no file); ``metrics``: the first chunk's."""
        return None

    def first_record(self, state) -> dict:
        """What is logged at step 0 of a fresh run."""
        return {}

    def run_chunk(self, state, n: int) -> tuple[Any, dict]:
        """``n`` iterations; returns the new state and the chunk's metrics (host floats)."""
        raise NotImplementedError

    def chunk_metrics(self, metrics: dict, n: int, dt: float, first_chunk: bool, step: int) -> None:
        """Adds what the runner derives from a chunk's wall time to ``metrics`` in place."""

    def eval_media(self, state, step: int) -> dict:
        """What an evaluation shows beyond scalars, for TensorBoard: ``{tag: text}`` or
        ``{tag: [H, W, 3] uint8 image}`` (sample generations, an episode strip)."""
        return {}

    # ------------------------------------------------------------------ the loop
    def write_placement(self, metrics: dict | None = None) -> None:
        info = self.placement_info(metrics)
        if info is not None and self.primary:
            # The XLA flags the process started with (runner.xla_cpu_flags adds to them).
            info = {**info, "xla_flags": os.environ.get("XLA_FLAGS", "")}
            write_atomic(self.run_dir.path / "placement.json", json.dumps(info, indent=2) + "\n")

    def evaluate(self, state, step: int) -> dict:
        t0 = time.perf_counter()
        ev = fetch(self.trainer.run_eval(state, eval_key(self.cfg, step)))
        out = {k: float(v) for k, v in ev.items()}
        out["time/eval_sec"] = time.perf_counter() - t0
        return out

    def run(self) -> LoopResult:
        """The run, start to end; the trainer's processes and threads are released on every
        path out of it (success, bad input, divergence, Ctrl-C)."""
        try:
            return self._run()
        except OSError as e:
            if not is_user_fs_error(e):
                raise
            # A full disk (or a folder made read-only) while logging: what was saved stays.
            raise BadInput(
                f"cannot write the run folder {self.run_dir.path} ({fs_error_text(e)}); free space (or fix its "
                "permissions) and continue with runner.resume=auto"
            ) from None
        finally:
            self.trainer.close()

    def _log_media(self, logger: MetricsLogger, state, step: int) -> None:
        if not self.cfg.runner.tensorboard:
            return
        for tag, shown in self.eval_media(state, step).items():  # every process: media may take collectives
            if isinstance(shown, str):
                logger.log_text(step, tag, shown)
            else:
                logger.log_image(step, tag, shown)

    def _restore(self, state):
        """The state a checkpoint holds (verified against its checksums), before anything is
        written: a bad checkpoint leaves the run folder untouched."""
        ckpt_dir, step = self.resume_path
        target = checkpoint_view(self.trainer.snapshot(state))
        with Checkpointer(ckpt_dir, keep=self.cfg.runner.keep_checkpoints) as ckpt:
            ts, meta = ckpt.restore(step, target)
        state = self.trainer.start(ts)
        self.trainer.load_meta(meta)
        self.last_good = Path(ckpt_dir) / str(step)
        return state, self.trainer.progress(state)[0]

    def _rewind(self, logger: MetricsLogger, checkpointer: Checkpointer, resumed_from: int | None) -> None:
        if resumed_from is not None:
            # What was logged or saved after the resume point belongs to a future this run rewrites.
            logger.truncate_after(resumed_from)
            checkpointer.delete_after(resumed_from)
        elif self.cfg.runner.resume == "auto" or self.cfg.runner.resume_overwrite:
            # Nothing to resume: a run that died before its first checkpoint (a restarted
            # multi-host job) starts over, and what it logged belongs to no future; with
            # resume_overwrite, so does whatever the folder held.
            logger.truncate_after(-1)
            checkpointer.delete_after(-1)

    def healthy(self, state) -> bool:
        """False while the latest iterations skipped a non-finite update. Such a state is
        never checkpointed, so rotation never drops the last good checkpoint."""
        return self.trainer.progress(state)[1] == 0

    def _save(self, checkpointer: Checkpointer, state, step: int) -> None:
        meta = {"step": step, **self.trainer.meta()}
        self.last_good = checkpointer.save(step, checkpoint_state(self.trainer, state), meta)

    def _diverged(self, bad: int, step: int) -> TrainingDiverged:
        where = f"the last good checkpoint is {self.last_good}" if self.last_good else "no checkpoint was saved"
        return TrainingDiverged(
            f"{bad} {self.unit} in a row produced non-finite losses or gradients (skipped, parameters untouched); "
            f"stopped at step {step}. {self.diverged_hint}; {where}"
        )

    def _run(self) -> LoopResult:
        cfg, trainer, run_dir = self.cfg, self.trainer, self.run_dir
        primary = self.primary
        state = trainer.init()
        resumed_from = None
        if self.resume_path is not None:
            state, resumed_from = self._restore(state)
        if run_dir.metrics_jsonl.is_file():
            read_metrics(run_dir.metrics_jsonl)  # a damaged file is bad input, before anything is written
        refuse_to_destroy(cfg, run_dir, self.resume_path, resumed_from)

        # Everything is checked: from here on the run writes its folder.
        if primary:
            run_dir.create(cfg)
            self.write_placement()
        with (
            MetricsLogger(run_dir, tensorboard=cfg.runner.tensorboard, write=primary) as logger,
            Checkpointer(run_dir.checkpoints, keep=cfg.runner.keep_checkpoints) as checkpointer,
        ):
            self._rewind(logger, checkpointer, resumed_from)
            if self.last_good is None and checkpointer.latest_step() is not None:
                self.last_good = checkpointer.step_path(checkpointer.latest_step())

            t0 = time.perf_counter()
            trainer.compile(state, eval_key(cfg, 0))
            compile_sec = self.compile_sec = time.perf_counter() - t0
            barrier("compiled")  # hosts compile at their own pace; the first chunk runs in step
            heartbeat()

            step = start_step = trainer.progress(state)[0]
            train_sec = 0.0
            first = last_eval = None
            show = cfg.runner.progress_bar and primary
            with ProgressBar(cfg.runner.max_steps, step, show, self.console, self.label, self.shown, self.bar_info) as bar:
                if step == 0:
                    # The resolved config beside the curves it produced.
                    logger.log_text(0, "config", f"```yaml\n{config_to_yaml(cfg)}\n```")
                    first = dict(self.first_record(state))
                    if self.eval_metric in first:
                        last_eval = first
                        self._log_media(logger, state, 0)
                    logger.log(0, first)
                    bar.update(0, first)
                while step < cfg.runner.max_steps:
                    target = next_boundary(step, cfg)
                    n = target - step
                    t0 = time.perf_counter()
                    state, metrics = self.run_chunk(state, n)
                    dt = time.perf_counter() - t0
                    train_sec += dt
                    step_before, step = step, target
                    final = step == cfg.runner.max_steps
                    self.chunk_metrics(metrics, n, dt, step_before == start_step, step)
                    heartbeat()

                    bad = trainer.progress(state)[1]
                    if bad >= cfg.runner.max_nonfinite_updates:
                        logger.log(step, metrics)
                        raise self._diverged(bad, step)
                    if due(step, cfg.runner.eval_interval, final):
                        ev = self.evaluate(state, step)
                        metrics.update(ev)
                        self._log_media(logger, state, step)
                        if self.eval_metric in ev:
                            last_eval = ev
                    save = due(step, cfg.runner.save_interval, final)
                    if save and not self.healthy(state):
                        # Reached through a skipped update: never saved (see `_save`).
                        save, metrics["checkpoint/skipped_unhealthy"] = False, 1.0
                    if due(step, cfg.runner.log_interval, final) or self.eval_metric in metrics or (
                        "checkpoint/skipped_unhealthy" in metrics
                    ):
                        logger.log(step, metrics)
                    if save:
                        # The step's record is durable before its checkpoint exists: a run
                        # killed at any point resumes with the metrics of every saved step.
                        logger.sync()
                        self._save(checkpointer, state, step)
                    bar.update(step, metrics)
        return LoopResult(
            run_dir=run_dir.path,
            step=step,
            start_step=start_step,
            resumed_from=resumed_from,
            train_sec=train_sec,
            compile_sec=compile_sec,
            first=first,
            last_eval=last_eval,
        )
