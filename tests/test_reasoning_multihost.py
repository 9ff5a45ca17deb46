"""Reasoning runs across hosts: two local processes of 4 fake CPU devices standing in for hosts.

The reference is one process with 8 devices running `python -m rlinf_jax.train`. The
same seed and config must give the same numbers through `python -m rlinf_jax.launch
--num-hosts 2` (up to float summation order across gloo): the SFT warm start and GRPO
collocated (every component over both hosts), and GRPO disaggregated (rollout and
reference on the first host, the actor on the second, so samples, reference log-probs
and weights cross hosts every iteration and the actor's state reaches the checkpoint
through the host) with cluster.scaling=dynamic (the update on both hosts' devices). Each launch compiles in both processes on a 2-core machine, so the
runs are two iterations of a tiny model.

Host rewards are shared out over the processes (`rewards.split`); that
splitting is checked in one process against scoring the whole batch at once.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from rlinf_jax.runtime import read_metrics
from tests import test_launch
from tests.conftest import forced_devices_env
from tests.test_launch import _assert_close, _launch
from tests.test_reasoning_flow import TINY_LM

# One local Ray instance at a time: with pytest-xdist (--dist loadgroup) these tests share a worker.
# Several JAX processes (a multi-host run on this machine): the multiprocess tier.
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.multiprocess]

# The embodied launcher tests' local Ray cluster (4 logical CPUs, bound to localhost).
ray_address = test_launch.ray_address

# A 2-layer, 64-wide character model; 60 SFT steps make it answer a few single-digit sums,
# so GRPO's groups see different rewards and the advantages are not all zero.
RUN = [
    "--config-name", "grpo_math",
    *TINY_LM,
    "data.rollout_batch_size=8",
    "algorithm.lm.group_size=4",
    "actor.global_batch_size=32",
    "actor.micro_batch_size=8",
    "algorithm.lm.kl_coef=0.01",  # the reference component too
    "runner.max_steps=2",
    "runner.eval_interval=2",
    "runner.log_interval=1",
    "runner.progress_bar=false",
    "runner.tensorboard=false",
    # The first answer that leaves the fast path imports math-verify; on a loaded machine
    # that can pass the default 5 s, and a timeout is a zero reward in one run only.
    "reward.timeout_s=300",
]
WARM = ["sft.warm_start_steps=60", "sft.lr=3e-3", "sft.batch_size=64"]


def _numbers(run_dir):
    return [
        {k: v for k, v in r.items() if not k.startswith("time/") and k != "rollout/tokens_per_sec"}
        for r in read_metrics(run_dir)
    ]


@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    """The reference: SFT warm start then GRPO, collocated, one process with 8 devices."""
    out = tmp_path_factory.mktemp("one_host")
    proc = subprocess.run(
        [sys.executable, "-m", "rlinf_jax.train", *RUN, *WARM, f"runner.output_dir={out}", "runner.experiment_name=ref"],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
        env=forced_devices_env(8),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = out / "ref"
    rewards = [r["rollout/accuracy"] for r in read_metrics(run_dir) if "rollout/accuracy" in r]
    assert max(rewards) > 0, rewards  # some group has a right answer: the comparison means something
    return run_dir


@pytest.mark.slow
def test_sft_and_grpo_collocated_on_two_hosts_match_one_host(ray_address, one_host, tmp_path):
    proc = _launch(ray_address, *RUN, *WARM, f"runner.output_dir={tmp_path}", "runner.experiment_name=two", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "two"
    _assert_close(_numbers(run_dir / "sft"), _numbers(one_host / "sft"))  # the warm start, run by both hosts
    _assert_close(_numbers(run_dir), _numbers(one_host))
    assert proc.stdout.count("done: 2 reasoning steps") == 1  # process 0's summary alone
    placement = json.loads((run_dir / "placement.json").read_text())
    assert placement["mode"] == "collocated"
    assert placement["components"]["actor"]["devices"] == list(range(8))
    state = run_dir / "checkpoints" / "2" / "state"
    assert {p.name for p in state.glob("ocdbt.process_*")} == {"ocdbt.process_0", "ocdbt.process_1"}


@pytest.mark.slow
def test_grpo_disaggregated_and_scaled_dynamically_on_two_hosts_matches_one_host(ray_address, one_host, tmp_path):
    # Starts from the reference's warm start: the same weights, loaded by both processes.
    # With cluster.scaling=dynamic the update runs on both hosts' devices: the actor's
    # state crosses from the second host to both and back every iteration, beside the
    # samples, reference log-probs and weights that cross in any disaggregated run.
    proc = _launch(ray_address, *RUN, "cluster.component_placement=disaggregated", "cluster.scaling=dynamic",
                   f"actor.model.path={one_host / 'sft'}", f"runner.output_dir={tmp_path}",
                   "runner.experiment_name=two", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "two"
    _assert_close(_numbers(run_dir), _numbers(one_host))
    placement = json.loads((run_dir / "placement.json").read_text())
    components = placement["components"]
    assert components["rollout"]["devices"] == [0, 1] and components["reference"]["devices"] == [2, 3]
    assert components["actor"]["devices"] == [4, 5, 6, 7]  # the second host's
    assert placement["phases"]["update"]["devices"] == list(range(8))
    assert all(r["time/switch_s"] > 0 for r in read_metrics(run_dir) if "train/loss" in r)


# ------------------------------------------------------------------ pieces, in one process
def test_rewards_shared_out_over_processes_equal_scoring_all_rows():
    from rlinf_jax.rewards.split import combine, row_share
    from rlinf_jax.rewards import RewardConfig, RewardFunction

    responses = [r"\boxed{4}", "7", r"so \boxed{9}", "no answer", r"\boxed{1/2}", "12", r"\boxed{5}"]
    answers = ["4", "8", "9", "3", "0.5", "12", "6"]
    lengths = np.array([3, 9, 12, 2, 11, 4, 12])
    cfg = RewardConfig(format_reward=0.1, overlong_max_len=12, overlong_cache_len=4)
    with RewardFunction(cfg) as fn:
        whole = fn(responses, answers, lengths)
        for processes in (2, 3, 8):  # 8 > 7 rows: some processes score nothing
            shares = [row_share(len(responses), p, processes) for p in range(processes)]
            assert [lo for lo, _ in shares][1:] == [hi for _, hi in shares][:-1]
            assert shares[0][0] == 0 and shares[-1][1] == len(responses)
            parts = [(lo, hi, fn(responses[lo:hi], answers[lo:hi], lengths[lo:hi])) for lo, hi in shares]
            got = combine(parts, len(responses))
            np.testing.assert_array_equal(got.rewards, whole.rewards)
            np.testing.assert_array_equal(got.correct, whole.correct)
            np.testing.assert_array_equal(got.failed, whole.failed)
            assert got.metrics.keys() == whole.metrics.keys()
            for key, value in whole.metrics.items():
                assert got.metrics[key] == pytest.approx(value, abs=1e-6), (processes, key)
    assert whole.metrics["reward/accuracy"] == pytest.approx(4 / 7)  # 4, 9, 1/2 = 0.5 and 12 are right


def test_launcher_accepts_reasoning_and_sft_and_checks_their_placement():
    from rlinf_jax.config import load_config
    from rlinf_jax.errors import BadInput
    from rlinf_jax.launch import _check_cluster_settings, _parse_args

    args = _parse_args(["--num-hosts", "2", "--devices-per-host", "4"])
    for recipe, placement in (("grpo_math", "disaggregated"), ("sft_math", "collocated")):
        _check_cluster_settings(args, load_config(recipe, [f"cluster.component_placement={placement}"]))
    # Ranks count over both hosts: 8 devices, rank 9 does not exist. The reasoning flow's
    # components (rollout, actor) are what the mapping must name.
    bad = load_config("grpo_math", ["cluster.component_placement={rollout: 0-3, actor: 4-9}"])
    with pytest.raises(BadInput, match="device rank 8 is out of range; 8 device"):
        _check_cluster_settings(args, bad)

