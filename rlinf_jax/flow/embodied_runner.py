"""The host loop of an embodied PPO run: chunks of fused iterations, eval, checkpoints.

The device runs `PPOTrainer.run_chunk` (many iterations in one jit); the host only wakes
at chunk boundaries, which sit at multiples of the log / eval / save intervals counted
from step 0. Boundaries therefore do not depend on where a run was resumed, which is
what makes a killed-and-resumed run end with exactly the same numbers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp

from rlinf_jax.config.schema import Config
from rlinf_jax.envs import make_env, make_eval_env
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.embodied_ppo import PPOTrainer
from rlinf_jax.runtime import Checkpointer, MetricsLogger, RunDir, resolve_resume
from rlinf_jax.runtime.progress import progress_bar
from rlinf_jax.sharding import Placement, data_mesh, resolve_num_devices, resolve_placement

EMBODIED_COMPONENTS = ("env", "rollout", "actor")


class TrainingDiverged(RuntimeError):
    """Updates kept producing non-finite losses or gradients; the run stopped."""


@dataclass
class RunSummary:
    run_dir: Path
    steps: int
    env_steps: int
    eval_return: float | None
    env_steps_per_sec: float
    compile_sec: float
    wall_sec: float
    resumed_from: int | None


def next_boundary(step: int, cfg: Config) -> int:
    r = cfg.runner
    candidates = [r.max_steps]
    for interval in (r.log_interval, r.eval_interval, r.save_interval):
        if interval > 0:
            candidates.append((step // interval + 1) * interval)
    return min(candidates)


def _due(step: int, interval: int, final: bool) -> bool:
    return final or (interval > 0 and step % interval == 0)


def enable_compilation_cache(directory: str) -> None:
    if directory:
        jax.config.update("jax_compilation_cache_dir", str(Path(directory).expanduser()))
        # Only programs worth caching: the fused iteration and the eval loop, not tiny ops.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def _placement(trainer: PPOTrainer) -> Placement:
    """The fused runner is collocated: env, rollout and actor share the data mesh."""
    n = trainer.mesh.devices.size
    return resolve_placement({"env,rollout,actor": f"0-{n - 1}"}, EMBODIED_COMPONENTS, jax.device_count())


def build_trainer(cfg: Config) -> PPOTrainer:
    env = make_env(cfg.env)
    eval_env = make_eval_env(cfg.env)
    mesh = data_mesh(resolve_num_devices(cfg.cluster.num_devices))
    return PPOTrainer(cfg, env, eval_env, mesh)


def run(cfg: Config, console=None) -> RunSummary:
    """Trains (or resumes) the run that ``cfg`` describes and returns its summary."""
    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    trainer = build_trainer(cfg)
    run_dir = RunDir.from_config(cfg)
    resume_path = resolve_resume(cfg, run_dir)
    if resume_path is None and cfg.runner.resume == "none" and run_dir.has_checkpoints():
        raise BadInput(
            f"{run_dir.path} already holds checkpoints; pass runner.resume=auto to continue that run "
            "or choose another runner.experiment_name"
        )

    ts = trainer.init()
    resumed_from = None
    # Restore before anything is written: a bad checkpoint must leave the run dir untouched.
    if resume_path is not None:
        ckpt_dir, step = resume_path
        ts, _ = Checkpointer(ckpt_dir, keep=cfg.runner.keep_checkpoints).restore(step, ts)
        ts = trainer.place(ts)
        resumed_from = int(ts.step)

    run_dir.create(cfg)
    _placement(trainer).write(run_dir.path / "placement.json")
    logger = MetricsLogger(run_dir, tensorboard=cfg.runner.tensorboard)
    checkpointer = Checkpointer(run_dir.checkpoints, keep=cfg.runner.keep_checkpoints)
    if resumed_from is not None:
        # What was logged or saved after the resume point belongs to a future this run rewrites.
        logger.truncate_after(resumed_from)
        checkpointer.delete_after(resumed_from)

    t0 = time.perf_counter()
    chunk = trainer.run_chunk.lower(ts, jnp.int32(1)).compile()
    eval_key = jax.random.PRNGKey(cfg.runner.seed + 1)
    evaluate = trainer.evaluate.lower(ts.params, ts.obs_stats, eval_key).compile()
    compile_sec = time.perf_counter() - t0

    step = int(ts.step)
    start_step = step
    train_sec = 0.0
    last_eval = None
    try:
        with progress_bar(cfg.runner.max_steps, step, enabled=cfg.runner.progress_bar, console=console) as bar:
            if step == 0:
                logger.log(0, {"time/compile_sec": compile_sec})
            while step < cfg.runner.max_steps:
                target = next_boundary(step, cfg)
                n = target - step
                t0 = time.perf_counter()
                ts, sums = chunk(ts, jnp.int32(n))
                metrics = trainer.summarize(sums, n)  # blocks until the chunk is done
                dt = time.perf_counter() - t0
                train_sec += dt
                step = target
                final = step == cfg.runner.max_steps
                metrics["time/env_steps_per_sec"] = n * trainer.env_steps_per_iteration / dt
                metrics["env/steps"] = step * trainer.env_steps_per_iteration

                if int(ts.bad_iterations) >= cfg.runner.max_nonfinite_updates:
                    logger.log(step, metrics)
                    raise TrainingDiverged(
                        f"{int(ts.bad_iterations)} iterations in a row produced non-finite losses or "
                        f"gradients (skipped, parameters untouched); stopped at step {step}. Lower "
                        "actor.optim.lr or check the env's rewards/observations; the last good "
                        f"checkpoint is in {run_dir.checkpoints}"
                    )
                if _due(step, cfg.runner.eval_interval, final):
                    t0 = time.perf_counter()
                    ev = evaluate(ts.params, ts.obs_stats, jax.random.fold_in(eval_key, step))
                    metrics.update({k: float(v) for k, v in ev.items()})
                    metrics["time/eval_sec"] = time.perf_counter() - t0
                    last_eval = metrics["eval/return"]
                if _due(step, cfg.runner.log_interval, final) or "eval/return" in metrics:
                    logger.log(step, metrics)
                if _due(step, cfg.runner.save_interval, final):
                    checkpointer.save(step, jax.device_get(ts), {"step": step})
                bar.update(step, metrics)
    finally:
        logger.close()

    ran = step - start_step
    return RunSummary(
        run_dir=run_dir.path,
        steps=step,
        env_steps=step * trainer.env_steps_per_iteration,
        eval_return=last_eval,
        env_steps_per_sec=ran * trainer.env_steps_per_iteration / train_sec if train_sec else 0.0,
        compile_sec=compile_sec,
        wall_sec=time.perf_counter() - t_start,
        resumed_from=resumed_from,
    )
