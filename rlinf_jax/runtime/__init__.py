"""Run directory, metrics logging and checkpoints: what a training run leaves on disk."""

from rlinf_jax.runtime.checkpoint import (
    Checkpointer,
    ResumePoint,
    find_checkpoint,
    list_steps,
    resolve_resume,
    restore_checkpoint,
)
from rlinf_jax.runtime.metrics import MetricsLogger, read_metrics
from rlinf_jax.runtime.run_dir import RunDir

__all__ = [
    "Checkpointer",
    "MetricsLogger",
    "ResumePoint",
    "find_checkpoint",
    "RunDir",
    "list_steps",
    "read_metrics",
    "resolve_resume",
    "restore_checkpoint",
]
