"""Host-simulator PPO across hosts: two local processes of one fake CPU device each stand in
for hosts, each with env workers under a second interpreter (a worker environment).

The reference is one process with two devices running `python -m rlinf_jax.train`. Each
process of `python -m rlinf_jax.launch --num-hosts 2` steps the envs its device's rows
hold, seeded by their global indices, so the rollouts, the data-parallel update and the
split evaluation give the same numbers (up to float summation order). Both runs stop
after two iterations and resume to four: the episode counters cross the checkpoint as
one array written by both processes, and each resumes its own envs' episodes. Placed
disaggregated, one host steps every env and the other updates, with the same numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlinf_jax.envs.install import inheriting_env
from rlinf_jax.runtime import read_metrics
from tests import test_launch
from tests.conftest import forced_devices_env
from tests.test_launch import _assert_close, _error_lines, _launch

pytest.importorskip("gymnasium")

# One local Ray instance at a time: with pytest-xdist (--dist loadgroup) these tests share a worker.
# Several JAX processes (a multi-host run on this machine): the multiprocess tier.
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.multiprocess]
ray_address = test_launch.ray_address

RUN = [
    "--config-name", "ppo_gym_mujoco",
    "env.num_envs=8", "env.num_eval_envs=4", "env.episode_length=20", "env.num_workers=1",
    "algorithm.rollout_length=8", "algorithm.num_minibatches=2", "algorithm.update_epochs=1",
    "actor.model.policy_hidden_sizes=[16,16]", "actor.model.value_hidden_sizes=[16,16]",
    "runner.save_interval=2", "runner.log_interval=1", "runner.eval_interval=2",
    "runner.progress_bar=false", "runner.tensorboard=false", "cluster.num_devices=all",
]


# SAC on the same simulator: the learner replicated on both hosts' devices.
SAC = [
    "--config-name", "sac_gym_mujoco",
    "env.num_envs=8", "env.num_eval_envs=4", "env.episode_length=20", "env.num_workers=1",
    "algorithm.rollout_length=4", "algorithm.offpolicy.utd_ratio=2", "algorithm.offpolicy.batch_size=16", "algorithm.offpolicy.learning_starts=16",
    "algorithm.offpolicy.replay_size=512", "actor.model.policy_hidden_sizes=[16,16]", "actor.model.value_hidden_sizes=[16,16]",
    "runner.save_interval=2", "runner.log_interval=1", "runner.eval_interval=2",
    "runner.progress_bar=false", "runner.tensorboard=false", "cluster.num_devices=all",
]


def _numbers(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith("time/") and "per_s" not in k} for r in read_metrics(run_dir)]


def _one_host(out, name, *args):
    proc = subprocess.run(
        [sys.executable, "-m", "rlinf_jax.train", *RUN, *args, f"runner.output_dir={out}",
         f"runner.experiment_name={name}"],
        capture_output=True, text=True, timeout=600, env=forced_devices_env(2),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_two_hosts_with_worker_environments_match_one_host_across_a_resume(ray_address, tmp_path):
    worker_python = f"env.worker_python={inheriting_env(tmp_path / 'venv')}"
    for steps in (2, 4):
        _one_host(tmp_path, "one_host", f"runner.max_steps={steps}", "runner.resume=auto")
        proc = _launch(ray_address, *RUN, worker_python, f"runner.max_steps={steps}", "runner.resume=auto",
                       f"runner.output_dir={tmp_path}", "runner.experiment_name=two_hosts", devices=1)
        assert proc.returncode == 0, test_launch._launcher_lines(proc.stderr) or proc.stderr[-3000:]
    ref, got = _numbers(tmp_path / "one_host"), _numbers(tmp_path / "two_hosts")
    assert [r["step"] for r in ref] == [0, 1, 2, 3, 4]
    assert sum(r.get("env/episodes", 0) for r in ref) > 0  # episodes ended, so their counters moved
    _assert_close(got, ref)
    state = tmp_path / "two_hosts" / "checkpoints" / "4" / "state"
    assert {p.name for p in state.glob("ocdbt.process_*")} == {"ocdbt.process_0", "ocdbt.process_1"}


@pytest.mark.slow
def test_disaggregated_over_two_hosts_matches_one_host(ray_address, tmp_path):
    """Envs and rollout on the first host, the update on the second: the rollout crosses
    hosts every iteration and the parameters come back; the numbers are one host's."""
    _one_host(tmp_path, "one_host", "runner.max_steps=2")
    proc = _launch(ray_address, *RUN, "cluster.component_placement=disaggregated", "runner.max_steps=2",
                   f"runner.output_dir={tmp_path}", "runner.experiment_name=two_hosts", devices=1)
    assert proc.returncode == 0, test_launch._launcher_lines(proc.stderr) or proc.stderr[-3000:]
    _assert_close(_numbers(tmp_path / "two_hosts"), _numbers(tmp_path / "one_host"))
    placement = json.loads((tmp_path / "two_hosts" / "placement.json").read_text())
    assert placement["components"]["rollout"]["devices"] == [0] and placement["components"]["actor"]["devices"] == [1]


@pytest.mark.slow
def test_env_and_rollout_on_different_hosts_are_refused_in_one_line(ray_address, tmp_path):
    proc = _launch(ray_address, *RUN, "cluster.component_placement={env: 0, rollout: 1, actor: 0-1}",
                   "runner.max_steps=1", f"runner.output_dir={tmp_path}", devices=1, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and "place env and rollout on the same hosts" in errors[0], proc.stderr[-3000:]


@pytest.mark.slow
def test_sac_on_two_hosts_matches_one_host_across_a_resume(ray_address, tmp_path):
    """The off-policy family across hosts: each process steps and acts on the envs of its
    rows, and the learner, replicated over both hosts' devices, learns from the joined
    segment, so two hosts log one host's numbers, through a resume with the buffer in the
    checkpoint."""
    for steps in (2, 3):
        args = [f"runner.max_steps={steps}", "runner.resume=auto", f"runner.output_dir={tmp_path}"]
        proc = subprocess.run([sys.executable, "-m", "rlinf_jax.train", *SAC, *args, "runner.experiment_name=one_host"],
                              capture_output=True, text=True, timeout=600, env=forced_devices_env(1))
        assert proc.returncode == 0, proc.stderr[-3000:]
        proc = _launch(ray_address, *SAC, *args, "runner.experiment_name=two_hosts", devices=1)
        assert proc.returncode == 0, test_launch._launcher_lines(proc.stderr) or proc.stderr[-3000:]
    ref, got = _numbers(tmp_path / "one_host"), _numbers(tmp_path / "two_hosts")
    assert [r["step"] for r in ref] == [0, 1, 2, 3]
    assert ref[-1]["train/gradient_steps"] > 0 and sum(r.get("env/episodes", 0) for r in ref) > 0
    _assert_close(got, ref)
    placement = json.loads((tmp_path / "two_hosts" / "placement.json").read_text())
    assert placement["runner"] == "Host" and placement["components"]["actor"]["devices"] == [0, 1]
