"""Learning from data: transitions collected from a trained PPO policy (python -m
rlinf_jax.collect), RLPD's batches mixing them with online transitions, and offline IQL
beating behaviour cloning on a dataset with a known mix of good and bad episodes."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from rlinf_jax import collect as collect_cli
from rlinf_jax.replay import TransitionBatch, read_transitions, write_transitions
from rlinf_jax.runtime import read_metrics
from rlinf_jax.tasks.offpolicy import learner as lib
from rlinf_jax.tasks.offpolicy.setup import make_setup
from rlinf_jax.tasks.offpolicy.trainer import OffPolicyTrainer
from rlinf_jax.tasks.registry import load_run_config
from rlinf_jax.train import main
from tests.test_offpolicy import TINY_SAC

QUIET = ["runner.progress_bar=false", "runner.tensorboard=false", "runner.compilation_cache=''"]


@pytest.fixture(scope="module")
def expert(tmp_path_factory):
    """A PPO policy that balances inverted_pendulum (the default recipe, 12 iterations)."""
    out = tmp_path_factory.mktemp("expert")
    assert main([f"runner.output_dir={out}", "runner.experiment_name=ppo", "runner.max_steps=12",
                 "runner.eval_interval=12", "env.num_eval_envs=32", *QUIET]) == 0
    final = [r for r in read_metrics(out / "ppo") if "eval/return" in r][-1]
    assert final["eval/return"] > 500, final
    return out / "ppo"


@pytest.fixture(scope="module")
def mixed(expert, tmp_path_factory):
    """20,000 transitions: half the envs follow the expert, half act at random."""
    path = tmp_path_factory.mktemp("data") / "mixed.parquet"
    assert collect_cli.main([str(expert), "--transitions", "20000", "--random-fraction", "0.5", "--out", str(path)]) == 0
    return path


@pytest.mark.slow
def test_collect_writes_the_policys_transitions(expert, mixed, tmp_path, capsys):
    capsys.readouterr()
    out = tmp_path / "expert.parquet"
    assert collect_cli.main([str(expert), "--transitions", "1024", "--out", str(out), "--seed", "3"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["transitions"] == 1024 and summary["policy"] == "deterministic" and summary["source_step"] == 12
    batch, meta = read_transitions(out, 4, 1)
    assert batch.size == 1024 and meta["env"] == "brax/inverted_pendulum"
    # Consecutive steps of one env chain up: the next observation is the next step's observation.
    obs, nxt = np.asarray(batch.obs).reshape(-1, 128, 4), np.asarray(batch.next_obs).reshape(-1, 128, 4)
    np.testing.assert_allclose(nxt[:-1], obs[1:], atol=1e-6)
    # The mixed dataset: random envs fall (short episodes), the expert's do not.
    data, meta = read_transitions(mixed)
    assert meta["random_fraction"] == 0.5 and meta["finished_episodes"] > 100 and meta["mean_return"] < 100
    # Refused: an existing file, a bad fraction.
    assert collect_cli.main([str(expert), "--transitions", "10", "--out", str(out)]) == 2
    assert collect_cli.main([str(expert), "--transitions", "10", "--random-fraction", "2", "--out", str(tmp_path / "x.parquet")]) == 2
    assert capsys.readouterr().err.count("error: ") == 2


def test_rlpd_batches_are_half_online_half_demonstrations(tmp_path):
    n = 64
    rng = np.random.default_rng(0)
    demos = TransitionBatch(
        obs=rng.normal(size=(n, 4)).astype(np.float32), action=rng.uniform(-1, 1, (n, 1)).astype(np.float32),
        reward=np.full(n, -7.0, np.float32), next_obs=rng.normal(size=(n, 4)).astype(np.float32),
        terminated=np.zeros(n, np.float32),
    )
    path = write_transitions(tmp_path / "demos.parquet", demos, np.zeros(n), np.zeros(n))
    cfg = load_run_config("rlpd_brax", [*TINY_SAC, f"algorithm.demo_path={path}", "algorithm.batch_size=40",
                                        "algorithm.demo_ratio=0.25"])
    trainer = OffPolicyTrainer(cfg, make_setup(cfg), jax.sharding.Mesh(jax.devices()[:1], ("data",)))
    ts = trainer.fresh_state()
    online = TransitionBatch(obs=np.ones((8, 4), np.float32), action=np.zeros((8, 1), np.float32),
                             reward=np.full(8, 3.0, np.float32), next_obs=np.ones((8, 4), np.float32),
                             terminated=np.zeros(8, np.float32))
    ts = ts.replace(replay=trainer.learner.buffer.add(ts.replay, online))
    batch = lib.sample_batch(trainer.learner, ts, trainer.demos, jax.random.PRNGKey(0))
    rewards = np.asarray(batch.reward)
    assert batch.size == 40 and np.sum(rewards == 3.0) == 30 and np.sum(rewards == -7.0) == 10


@pytest.mark.slow
def test_offline_iql_beats_behaviour_cloning_on_a_mixed_dataset(mixed, tmp_path):
    """Half the dataset's episodes are the expert's, half random: cloning copies the mix,
    IQL's advantage weights pick the expert's actions."""
    returns = {}
    for name, beta in (("iql", "3.0"), ("bc", "0.0")):
        assert main(["--config-name", "iql_brax", f"algorithm.demo_path={mixed}", f"runner.output_dir={tmp_path}",
                     f"runner.experiment_name={name}", f"algorithm.awr_temperature={beta}", "runner.max_steps=10",
                     "algorithm.offline_iterations=10", "algorithm.utd_ratio=10", "runner.eval_interval=10",
                     "runner.save_interval=0", "actor.model.policy_hidden_sizes=[64,64]",
                     "actor.model.value_hidden_sizes=[64,64]", *QUIET]) == 0
        records = read_metrics(tmp_path / name)
        assert all(r.get("env/steps", 0) == 0 for r in records)  # offline: the env was never stepped for training
        returns[name] = records[-1]["eval/return"]
    assert returns["iql"] > 150 and returns["iql"] > 2 * returns["bc"], returns
