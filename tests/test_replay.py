"""The replay buffer, fixed datasets and the transitions file format."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlinf_jax.errors import BadInput
from rlinf_jax.replay import ReplayBuffer, TransitionBatch, TransitionDataset, read_transitions, write_transitions


def _step(t: int, num_envs: int, obs_size: int = 3) -> TransitionBatch:
    """Transition of env i at time t, every field encoding (t, i) so a sample names its source."""
    tag = (100 * t + jnp.arange(num_envs)).astype(jnp.float32)
    return TransitionBatch(
        obs=jnp.repeat(tag[:, None], obs_size, axis=1),
        action=jnp.stack([tag / 1000.0, -tag / 1000.0], axis=1),
        reward=tag,
        next_obs=jnp.repeat(tag[:, None] + 0.5, obs_size, axis=1),
        terminated=(tag % 2).astype(jnp.float32),
    )


def test_inserted_transitions_come_back_whole_and_uniformly():
    buf = ReplayBuffer(capacity=40, num_envs=4, sample_size=2000)
    state = buf.init(_step(0, 4))
    add = jax.jit(buf.add)
    for t in range(6):
        state = add(state, _step(t, 4))
    assert int(buf.size(state)) == 24
    sample = jax.jit(buf.sample)(state, jax.random.PRNGKey(0))
    tags = np.asarray(sample.reward)
    stored = {100 * t + i for t in range(6) for i in range(4)}
    assert set(tags.astype(int)) == stored  # every stored transition shows up, nothing else
    # Fields travel together: each sampled row is one transition.
    np.testing.assert_array_equal(np.asarray(sample.obs)[:, 0], tags)
    np.testing.assert_array_equal(np.asarray(sample.next_obs)[:, 0], tags + 0.5)
    np.testing.assert_allclose(np.asarray(sample.action)[:, 0], tags / 1000.0, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(sample.terminated), tags % 2)
    # Uniform: each of the 24 is drawn 2000/24 ~ 83 times; a chi-square test at a generous level.
    counts = np.array([np.sum(tags == s) for s in sorted(stored)])
    chi2 = np.sum((counts - 2000 / 24) ** 2 / (2000 / 24))
    assert chi2 < 60, counts  # 23 degrees of freedom: p ~ 5e-5 at 60


def test_the_ring_overwrites_the_oldest_transitions():
    buf = ReplayBuffer(capacity=8, num_envs=2, sample_size=500)  # 4 per env
    state = buf.init(_step(0, 2))
    for t in range(7):
        state = buf.add(state, _step(t, 2))
    assert int(buf.size(state)) == 8
    tags = set(np.asarray(buf.sample(state, jax.random.PRNGKey(1)).reward).astype(int))
    assert tags == {100 * t + i for t in range(3, 7) for i in range(2)}  # steps 0-2 are gone


def test_capacity_below_one_transition_per_env_is_refused():
    with pytest.raises(BadInput, match="replay_size"):
        ReplayBuffer(capacity=3, num_envs=4, sample_size=1)


def test_dataset_samples_uniformly_with_replacement():
    data = TransitionDataset.from_arrays(jax.tree.map(np.asarray, _step(0, 5)))
    tags = np.asarray(data.sample(jax.random.PRNGKey(0), 1000).reward).astype(int)
    assert set(tags) == set(range(5))
    assert min(np.bincount(tags)) > 150


def _batch(n=12, obs=3, act=2, seed=0):
    rng = np.random.default_rng(seed)
    return TransitionBatch(
        obs=rng.normal(size=(n, obs)).astype(np.float32),
        action=rng.uniform(-1, 1, size=(n, act)).astype(np.float32),
        reward=rng.normal(size=n).astype(np.float32),
        next_obs=rng.normal(size=(n, obs)).astype(np.float32),
        terminated=(rng.uniform(size=n) < 0.2).astype(np.float32),
    )


def test_a_transitions_file_round_trips(tmp_path):
    batch = _batch()
    timeouts = np.zeros(12, bool)
    timeouts[5] = True
    path = write_transitions(tmp_path / "d.parquet", batch, timeouts, np.arange(12) // 4, {"env": "brax/x"})
    back, meta = read_transitions(path, 3, 2)
    for a, b in zip(jax.tree.leaves(batch), jax.tree.leaves(back)):
        np.testing.assert_array_equal(a, b)
    assert meta["format"] == "rlinf_jax.transitions" and meta["transitions"] == 12 and meta["env"] == "brax/x"
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    assert table.column("timeouts").to_pylist()[5] is True and table.column("episode").to_pylist()[-1] == 2
    with pytest.raises(BadInput, match="exists"):
        write_transitions(path, batch, timeouts, np.zeros(12))


@pytest.mark.parametrize(
    "damage, message",
    [
        ("sizes", "observations of size 3, but the env's are of size 4"),
        ("garbage", "not a readable Parquet file"),
        ("missing", "does not exist"),
        ("columns", "lacks the column"),
        ("actions", "outside \\[-1, 1\\]"),
        ("nan", "non-finite"),
    ],
)
def test_bad_transition_files_are_one_line(tmp_path, damage, message):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    batch = _batch()
    if damage == "actions":
        batch = batch.replace(action=batch.action * 3)
    if damage == "nan":
        batch.reward[2] = np.nan
    if damage != "missing":
        write_transitions(path, batch, np.zeros(12), np.zeros(12))
    if damage == "garbage":
        path.write_bytes(b"PAR1 not really")
    if damage == "columns":
        pq.write_table(pa.table({"observations": [[1.0]]}), path)
    with pytest.raises(BadInput, match=message):
        read_transitions(path, 4 if damage == "sizes" else 3, 2)


def test_metadata_is_json_in_the_schema(tmp_path):
    import pyarrow.parquet as pq

    path = write_transitions(tmp_path / "d.parquet", _batch(), np.zeros(12), np.zeros(12), {"mean_return": 7.5})
    meta = json.loads(pq.read_schema(path).metadata[b"rlinf_jax"])
    assert meta["observation_size"] == 3 and meta["action_size"] == 2 and meta["mean_return"] == 7.5


def _columns():
    """Four transitions as plain Python columns (what pandas or a D4RL export writes)."""
    return {
        "observations": [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]],
        "actions": [[0.1], [0.2], [-0.3], [0.4]],
        "rewards": [1.0, 2.0, 3.0, 4.0],
        "next_observations": [[2.0, 3.0], [4.0, 5.0], [6.0, 7.0], [8.0, 9.0]],
        "terminals": [False, False, False, True],
    }


def _write(path, columns, metadata=None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(columns)
    if metadata is not None:
        table = table.replace_schema_metadata({b"rlinf_jax": metadata})
    pq.write_table(table, path)
    return path


def test_a_transitions_file_written_by_other_tools_reads_row_by_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # list<double> columns, 0/1 integer terminals, two record batches: each row stays whole.
    columns = {**_columns(), "terminals": [0, 0, 0, 1], "timeouts": [0, 0, 1, 0], "episode": [0, 0, 0, 1]}
    table = pa.table(columns)
    path = tmp_path / "d.parquet"
    pq.write_table(pa.concat_tables([table.slice(0, 1), table.slice(1)]), path, row_group_size=2)
    batch, meta = read_transitions(path, 2, 1)
    assert meta == {}
    np.testing.assert_array_equal(batch.obs, np.array(columns["observations"], np.float32))
    np.testing.assert_array_equal(batch.next_obs[3], [8.0, 9.0])
    np.testing.assert_array_equal(batch.action[:, 0], np.array([0.1, 0.2, -0.3, 0.4], np.float32))
    np.testing.assert_array_equal(batch.reward, [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(batch.terminated, [0.0, 0.0, 0.0, 1.0])


@pytest.mark.parametrize(
    "column, values, message",
    [
        # 2 + 6 + 2 + 6 values make 4 rows of 4: each would mix two transitions.
        ("observations", [[0.0] * 2, [1.0] * 6, [2.0] * 2, [3.0] * 6],
         "column observations has rows of different lengths \\(row 1 holds 2 values, row 2 holds 6\\)"),
        ("next_observations", [[0.0, 1.0], [2.0, 3.0], [4.0], [5.0, 6.0, 7.0]],
         "column next_observations has rows of different lengths \\(row 1 holds 2 values, row 3 holds 1\\)"),
        ("actions", [[0.1], [0.2], None, [0.4]], "column actions row 3 is null"),
        ("observations", [[0.0, 1.0], [2.0, None], [4.0, 5.0], [6.0, 7.0]], "column observations row 2 holds a null"),
        ("observations", "empty", "column observations holds empty lists"),
        ("observations", [["a", "b"]] * 4, "column observations is list<.*string.*>, not a list of numbers"),
        ("actions", [0.1, 0.2, 0.3, 0.4], "column actions is double, not a list of numbers"),
        ("rewards", ["1", "2", "3", "4"], "column rewards is string, not one number per row"),
        ("rewards", [[1.0], [2.0], [3.0], [4.0]], "column rewards is list<.*>, not one number per row"),
        ("rewards", [True, False, True, False], "column rewards is bool, not one number per row"),
        ("rewards", [1.0, None, 3.0, 4.0], "column rewards row 2 is null"),
        ("terminals", ["no", "no", "no", "yes"], "column terminals is string, not one bool \\(or 0/1\\) per row"),
        ("terminals", [0.0, 0.5, 0.0, 1.0], "column terminals row 2 holds 0.5"),
        ("terminals", [False, None, False, True], "column terminals row 2 is null"),
        ("timeouts", ["x", "y", "z", "w"], "column timeouts is string"),
        ("episode", [0.5, 0.5, 1.0, 1.0], "column episode is double, not one integer per row"),
    ],
)
def test_malformed_columns_are_one_line_naming_the_column_and_row(tmp_path, column, values, message):
    import pyarrow as pa

    if values == "empty":  # observations of width 0, typed as numbers
        values = pa.array([[]] * 4, pa.list_(pa.float32()))
    path = _write(tmp_path / "d.parquet", {**_columns(), column: values})
    with pytest.raises(BadInput, match=message) as e:
        read_transitions(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("metadata, message", [(b"[1, 2]", "a JSON list, not an object"), (b"7", "a JSON int"),
                                               (b"{oops", "not JSON")])
def test_metadata_that_is_not_a_json_object_is_refused(tmp_path, metadata, message):
    path = _write(tmp_path / "d.parquet", _columns(), metadata)
    with pytest.raises(BadInput, match=message):
        read_transitions(path)


def test_a_directory_given_as_the_transitions_file_is_named_so(tmp_path):
    _write(tmp_path / "demos.parquet", _columns())
    with pytest.raises(BadInput, match="is a directory \\(it holds demos.parquet\\); give the path of one .parquet"):
        read_transitions(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match="empty is a directory; give the path"):
        read_transitions(tmp_path / "empty")
