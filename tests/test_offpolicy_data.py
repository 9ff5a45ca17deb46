"""Learning from data: transitions collected from a trained PPO policy (python -m
rlinf_jax.collect), RLPD's batches mixing them with online transitions, and offline IQL
beating behaviour cloning on a dataset with a known mix of good and bad episodes."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from rlinf_jax import collect as collect_cli
from rlinf_jax.errors import BadInput
from rlinf_jax.replay import TransitionBatch, read_transitions, write_transitions
from rlinf_jax.runtime import read_metrics
from rlinf_jax.tasks.offpolicy import learner as lib
from rlinf_jax.tasks.offpolicy.setup import make_setup
from rlinf_jax.tasks.offpolicy.algorithm import OffPolicy
from rlinf_jax.tasks.registry import load_run_config
from rlinf_jax.cli.train import main
from tests.conftest import run_cli
from tests.test_offpolicy import TINY_SAC

QUIET = ["runner.progress_bar=false", "runner.tensorboard=false", "runner.compilation_cache=''"]


# The two tests that learn from the expert's data share one worker (pytest-xdist's
# loadgroup), so the module's expert and dataset are made once, not once per worker.
SHARES_THE_EXPERT = pytest.mark.xdist_group("offpolicy_data_expert")


@pytest.fixture(scope="module")
def expert(tmp_path_factory):
    """A PPO policy that balances inverted_pendulum (the default recipe, 12 iterations),
    trained in a child process compiling as users do: its 123k env steps run ~1.5x faster
    than under the tests' unoptimised flags."""
    out = tmp_path_factory.mktemp("expert")
    proc = run_cli([f"runner.output_dir={out}", "runner.experiment_name=ppo", "runner.max_steps=12",
                    "runner.eval_interval=12", "env.num_eval_envs=32", *QUIET], env_extra={"XLA_FLAGS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
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
@SHARES_THE_EXPERT
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
    cfg = load_run_config("rlpd_brax", [*TINY_SAC, f"algorithm.offpolicy.demo_path={path}", "algorithm.offpolicy.batch_size=40",
                                        "algorithm.offpolicy.demo_ratio=0.25"])
    algorithm = OffPolicy(cfg, make_setup(cfg), jax.sharding.Mesh(jax.devices()[:1], ("data",)))
    ts = algorithm.fresh_state()
    online = TransitionBatch(obs=np.ones((8, 4), np.float32), action=np.zeros((8, 1), np.float32),
                             reward=np.full(8, 3.0, np.float32), next_obs=np.ones((8, 4), np.float32),
                             terminated=np.zeros(8, np.float32))
    ts = ts.replace(replay=algorithm.learner.buffer.add(ts.replay, online))
    batch = lib.sample_batch(algorithm.learner, ts, algorithm.demos, jax.random.PRNGKey(0))
    rewards = np.asarray(batch.reward)
    assert batch.size == 40 and np.sum(rewards == 3.0) == 30 and np.sum(rewards == -7.0) == 10


@pytest.mark.parametrize("damage", ["ragged", "directory"])
def test_a_bad_demo_path_is_one_line_before_training(tmp_path, damage):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # inverted_pendulum's observations are 4 wide: rows of 2, 6, 2, 6 values hold 16 in all, which
    # a flat reshape would cut into 4 rows of 4 that each mix two transitions.
    path = tmp_path / "demos.parquet"
    pq.write_table(pa.table({
        "observations": [[0.0] * 2, [1.0] * 6, [2.0] * 2, [3.0] * 6],
        "actions": [[0.0]] * 4,
        "rewards": [1.0] * 4,
        "next_observations": [[0.0] * 4] * 4,
        "terminals": [False] * 4,
    }), path)
    demo_path, message = (path, "column observations has rows of different lengths") if damage == "ragged" else (
        tmp_path, "is a directory \\(it holds demos.parquet\\)")
    cfg = load_run_config("rlpd_brax", [*TINY_SAC, f"algorithm.offpolicy.demo_path={demo_path}"])
    with pytest.raises(BadInput, match=message) as e:
        make_setup(cfg)
    assert "\n" not in str(e.value)


@pytest.mark.slow
@SHARES_THE_EXPERT
def test_offline_iql_beats_behaviour_cloning_on_a_mixed_dataset(mixed, tmp_path):
    """Half the dataset's episodes are the expert's, half random: cloning copies the mix,
    IQL's advantage weights pick the expert's actions."""
    returns = {}
    for name, beta in (("iql", "3.0"), ("bc", "0.0")):
        assert main(["--config-name", "iql_brax", f"algorithm.offpolicy.demo_path={mixed}", f"runner.output_dir={tmp_path}",
                     f"runner.experiment_name={name}", f"algorithm.offpolicy.awr_temperature={beta}", "runner.max_steps=10",
                     "algorithm.offpolicy.offline_iterations=10", "algorithm.offpolicy.utd_ratio=10", "runner.eval_interval=10",
                     "runner.save_interval=0", "actor.model.policy_hidden_sizes=[64,64]",
                     "actor.model.value_hidden_sizes=[64,64]", *QUIET]) == 0
        records = read_metrics(tmp_path / name)
        assert all(r.get("env/steps", 0) == 0 for r in records)  # offline: the env was never stepped for training
        returns[name] = records[-1]["eval/return"]
    assert returns["iql"] > 150 and returns["iql"] > 2 * returns["bc"], returns


@pytest.mark.slow
def test_a_missing_dataset_names_the_command_that_makes_it(tmp_path, capsys):
    """A fresh checkout has no demonstrations: the run stops in one line naming one command,
    and that command (here with a tiny expert) trains the expert and writes the file."""
    import shlex

    from tests.conftest import TINY

    demos = tmp_path / "demos" / "pendulum.parquet"
    rlpd = ["--config-name", "rlpd_brax", *TINY_SAC, f"algorithm.offpolicy.demo_path={demos}", f"runner.output_dir={tmp_path}",
            "runner.experiment_name=rlpd", *QUIET]
    assert main(rlpd) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"algorithm.offpolicy.demo_path={demos} does not exist" in err, err
    command = f"python -m rlinf_jax.collect --expert ppo_brax --transitions 20000 --out {demos}"
    assert err.endswith(f"make it with: {command}"), err
    iql = load_run_config("iql_brax", [*TINY_SAC, f"algorithm.offpolicy.demo_path={demos}"])
    with pytest.raises(BadInput, match="--expert ppo_brax --transitions 4096 --random-fraction 0.5 --out"):
        make_setup(iql)  # IQL's buffer (4096 here) holds its dataset

    expert = [*TINY, "runner.max_steps=2", f"runner.output_dir={tmp_path}", "runner.experiment_name=expert", *QUIET]
    assert collect_cli.main([*shlex.split(command)[3:], *expert]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["transitions"] == 20000 and summary["source_step"] == 2
    # The run reads it; a second call finds the expert trained and leaves its run alone.
    assert make_setup(load_run_config("rlpd_brax", rlpd[2:])).dataset.size == 20000
    records = (tmp_path / "expert" / "metrics.jsonl").read_text()
    assert collect_cli._expert_run("ppo_brax", expert) == str(tmp_path / "expert")
    assert "already trained to step 2" in capsys.readouterr().err
    assert (tmp_path / "expert" / "metrics.jsonl").read_text() == records
