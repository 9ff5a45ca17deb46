"""The config keys every env-stepping run reads (beside its algorithm's and its model's)."""

from __future__ import annotations

ENV = {
    "env.suite", "env.name", "env.backend", "env.num_envs", "env.num_eval_envs", "env.episode_length",
    "env.reset_mode", "env.action_repeat",
}
HOST = {"env.num_workers", "env.worker_python", "env.step_timeout_s", "env.gym_kwargs", "env.camera", "env.assets_dir",
        "env.worker_cpus", "env.worker_start_timeout_s", "env.max_worker_restarts"}
# The precisions an MLP policy's products may run in.
COMPUTE_DTYPES = ("float32", "bfloat16")
