"""Transitions on disk: one Parquet file, columns named as D4RL names its arrays.

    observations        list<float32>[obs_size]   the observation the action was taken from
    actions             list<float32>[act_size]   the env action, in [-1, 1]
    rewards             float32
    next_observations   list<float32>[obs_size]   where the step led (an episode's last observation when it ended)
    terminals           bool                      the episode ended by the task: no bootstrap
    timeouts            bool                      the episode was cut by a time limit
    episode             int64                     which episode (unique within the file)

The schema's metadata (key ``rlinf_jax``) holds a JSON object: ``format``
(``rlinf_jax.transitions``), ``version``, ``observation_size``, ``action_size`` and what the
writer adds (the env, the policy that acted, its mean return). Any tool that writes these
columns (pandas, pyarrow, a D4RL / Minari export) makes a file RLPD and IQL read. Reading
checks every column (equal list lengths, no nulls, numbers where numbers belong), so a
malformed file is one `BadInput` line naming the column and the first bad row.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rlinf_jax.errors import BadInput
from rlinf_jax.replay.buffer import TransitionBatch

FORMAT, VERSION, META_KEY = "rlinf_jax.transitions", 1, b"rlinf_jax"
VECTOR_COLUMNS = ("observations", "actions", "next_observations")
SCALAR_COLUMNS = ("rewards", "terminals", "timeouts", "episode")
# What each of them must hold: flags are true/false or 0/1.
SCALAR_KINDS = {"rewards": "number", "terminals": "flag", "timeouts": "flag", "episode": "integer"}


def write_transitions(path, batch: TransitionBatch, timeouts, episode, meta: dict | None = None) -> Path:
    """Writes ``batch`` (host arrays ``[N, ...]``) and its per-transition ``timeouts`` and
    ``episode`` ids to ``path`` (a new ``.parquet`` file; an existing one is refused)."""
    import pyarrow as pa  # heavy; only the commands that read or write datasets need it
    import pyarrow.parquet as pq

    path = Path(path)
    if path.suffix != ".parquet":
        raise BadInput(f"{path}: transitions are written as Parquet; give a path ending in .parquet")
    if path.exists():
        raise BadInput(f"{path} exists; choose a new file name")
    obs, action = np.asarray(batch.obs, np.float32), np.asarray(batch.action, np.float32)
    if obs.ndim != 2 or action.ndim != 2:
        raise BadInput("only flat observations and actions can be written as transitions")

    def vectors(x):
        return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(x).reshape(-1)), x.shape[1])

    table = pa.table({
        "observations": vectors(obs),
        "actions": vectors(action),
        "rewards": pa.array(np.asarray(batch.reward, np.float32)),
        "next_observations": vectors(np.asarray(batch.next_obs, np.float32)),
        "terminals": pa.array(np.asarray(batch.terminated) > 0),
        "timeouts": pa.array(np.asarray(timeouts) > 0),
        "episode": pa.array(np.asarray(episode, np.int64)),
    })
    info = {"format": FORMAT, "version": VERSION, "observation_size": obs.shape[1], "action_size": action.shape[1],
            "transitions": len(table), **(meta or {})}
    table = table.replace_schema_metadata({META_KEY: json.dumps(info).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)  # a reader never sees half a file
    return path


def read_transitions(path, observation_size: int | None = None, action_size: int | None = None):
    """``(TransitionBatch of host arrays, metadata dict)`` from a file `write_transitions`
    wrote (or any Parquet file with its columns); sizes, when given, must match."""
    import pyarrow as pa  # heavy; only the commands that read or write datasets need it
    import pyarrow.parquet as pq

    path = Path(path)
    if path.is_dir():
        inside = sorted(f.name for f in path.glob("*.parquet"))[:3]
        hint = f" (it holds {', '.join(inside)})" if inside else ""
        raise BadInput(f"transitions file {path} is a directory{hint}; give the path of one .parquet file")
    if not path.is_file():
        raise BadInput(
            f"transitions file {path} does not exist; write one from a trained run with python -m rlinf_jax.collect "
            f"RUN --transitions N --out {path} (docs/offpolicy.md)"
        )
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise BadInput(f"{path} is not a readable Parquet file ({str(e).splitlines()[0]}); rewrite it") from None
    missing = [c for c in (*VECTOR_COLUMNS, "rewards", "terminals") if c not in table.column_names]
    if missing:
        raise BadInput(f"{path} lacks the column(s) {', '.join(missing)} of a transitions file (see docs/offpolicy.md)")
    meta = _metadata(table, path)
    if len(table) == 0:
        raise BadInput(f"{path} holds no transitions")
    obs, action, next_obs = (_vectors(table.column(c).combine_chunks(), c, path) for c in VECTOR_COLUMNS)
    for name, got, want in (("observation", obs.shape[1], observation_size), ("action", action.shape[1], action_size)):
        if want is not None and got != want:
            raise BadInput(f"{path} holds {name}s of size {got}, but the env's are of size {want}; use a dataset of this env")
    if next_obs.shape != obs.shape:
        raise BadInput(f"{path}: next_observations {next_obs.shape} do not match observations {obs.shape}")
    # timeouts and episode are optional, but a file that has them must hold what they mean.
    present = [c for c in SCALAR_COLUMNS if c in table.column_names]
    scalars = {c: _scalars(table.column(c).combine_chunks(), c, path) for c in present}
    batch = TransitionBatch(
        obs=obs,
        action=action,
        reward=scalars["rewards"].astype(np.float32),
        next_obs=next_obs,
        terminated=scalars["terminals"].astype(np.float32),
    )
    if not all(np.all(np.isfinite(x)) for x in (obs, action, batch.reward, next_obs)):
        raise BadInput(f"{path} holds non-finite values; clean the dataset")
    if np.any(np.abs(action) > 1.0 + 1e-6):
        raise BadInput(f"{path} holds actions outside [-1, 1]; scale them to the env's normalised action range")
    return batch, meta


def _metadata(table, path: Path) -> dict:
    """The schema's rlinf_jax JSON object ({} without one); run records merge it as a dict."""
    raw = (table.schema.metadata or {}).get(META_KEY)
    if not raw:
        return {}
    try:
        meta = json.loads(raw)
    except ValueError:
        raise BadInput(f"{path}: its rlinf_jax metadata is not JSON; rewrite the file") from None
    if not isinstance(meta, dict):
        kind = type(meta).__name__
        raise BadInput(f"{path}: its rlinf_jax metadata is a JSON {kind}, not an object; rewrite the file")
    return meta


def _is_number(arrow_type) -> bool:
    import pyarrow as pa  # heavy; only the commands that read or write datasets need it

    return pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)


def _first(mask) -> int:
    """The 1-based row number of the first true entry of a pyarrow boolean array, or 0."""
    hits = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
    return int(hits[0]) + 1 if hits.size else 0


def _vectors(col, name: str, path: Path) -> np.ndarray:
    """A list column as ``[rows, width]`` float32. Every row must hold the same number of
    values: rows of 2, 6, 2, 6 would otherwise reshape into 4 rows of 4 that each mix two
    transitions."""
    import pyarrow as pa  # heavy; only the commands that read or write datasets need it
    import pyarrow.compute as pc

    kind = col.type
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    if not is_list or not _is_number(kind.value_type):
        raise BadInput(f"{path}: column {name} is {kind}, not a list of numbers per row; write a list<float> column")
    row = _first(col.is_null())
    if row:
        raise BadInput(f"{path}: column {name} row {row} is null; every row needs its list of numbers")
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    width = int(lengths[0])
    bad = np.flatnonzero(lengths != width)
    if bad.size:
        raise BadInput(
            f"{path}: column {name} has rows of different lengths (row 1 holds {width} values, row {bad[0] + 1} "
            f"holds {lengths[bad[0]]}); every row of a column needs the same number of values"
        )
    if width == 0:
        raise BadInput(f"{path}: column {name} holds empty lists; every row needs at least one value")
    values = col.flatten()
    entry = _first(values.is_null())
    if entry:
        raise BadInput(f"{path}: column {name} row {(entry - 1) // width + 1} holds a null value; clean the dataset")
    return np.asarray(values.to_numpy(zero_copy_only=False), np.float32).reshape(len(col), width)


def _scalars(col, name: str, path: Path) -> np.ndarray:
    """A one-value-per-row column as numpy, checked against what ``name`` means."""
    import pyarrow as pa  # heavy; only the commands that read or write datasets need it

    kind, want = col.type, SCALAR_KINDS[name]
    fits = {
        "number": _is_number(kind),
        "flag": _is_number(kind) or pa.types.is_boolean(kind),
        "integer": pa.types.is_integer(kind),
    }[want]
    if not fits:
        expected = {"number": "one number", "flag": "one bool (or 0/1)", "integer": "one integer"}[want]
        raise BadInput(f"{path}: column {name} is {kind}, not {expected} per row; rewrite that column")
    row = _first(col.is_null())
    if row:
        raise BadInput(f"{path}: column {name} row {row} is null; every row needs a value")
    values = col.to_numpy(zero_copy_only=False)
    if want == "flag":
        bad = np.flatnonzero((values != 0) & (values != 1))
        if bad.size:
            row, value = bad[0] + 1, values[bad[0]]
            raise BadInput(f"{path}: column {name} row {row} holds {value}; {name} are true/false or 0/1")
    return values
