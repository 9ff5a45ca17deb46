"""Shared test settings: tiny training configs and a subprocess runner for the CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Small enough to compile and run in seconds on a 2-core CPU, big enough to learn a little.
TINY = [
    "env.num_envs=16",
    "env.num_eval_envs=16",
    "env.episode_length=200",
    "algorithm.rollout_length=16",
    "algorithm.num_minibatches=4",
    "algorithm.update_epochs=2",
    "actor.model.policy_hidden_sizes=[16,16]",
    "actor.model.value_hidden_sizes=[32,32]",
    "runner.progress_bar=false",
]


@pytest.fixture
def tiny(tmp_path):
    """Overrides for a tiny inverted_pendulum run writing under tmp_path."""
    return [*TINY, f"runner.output_dir={tmp_path}", "runner.experiment_name=t"]


def run_cli(args, env_extra=None, **kwargs):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "rlinf_jax.train", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        **kwargs,
    )
