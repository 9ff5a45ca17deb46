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
columns (pandas, pyarrow, a D4RL / Minari export) makes a file RLPD and IQL read.
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
    meta = {}
    raw_meta = (table.schema.metadata or {}).get(META_KEY)
    if raw_meta:
        try:
            meta = json.loads(raw_meta)
        except ValueError:
            raise BadInput(f"{path}: its rlinf_jax metadata is not JSON; rewrite the file") from None
    n = len(table)
    if n == 0:
        raise BadInput(f"{path} holds no transitions")

    def vectors(name):
        col = table.column(name).combine_chunks()
        try:
            flat = np.asarray(col.flatten(), np.float32)
        except (pa.ArrowException, TypeError, ValueError):
            raise BadInput(f"{path}: column {name} is not a list of numbers per row") from None
        if flat.size % n:
            raise BadInput(f"{path}: column {name} has rows of different lengths")
        return flat.reshape(n, flat.size // n)

    obs, action, next_obs = (vectors(c) for c in VECTOR_COLUMNS)
    for name, got, want in (("observation", obs.shape[1], observation_size), ("action", action.shape[1], action_size)):
        if want is not None and got != want:
            raise BadInput(f"{path} holds {name}s of size {got}, but the env's are of size {want}; use a dataset of this env")
    if next_obs.shape != obs.shape:
        raise BadInput(f"{path}: next_observations {next_obs.shape} do not match observations {obs.shape}")
    batch = TransitionBatch(
        obs=obs,
        action=action,
        reward=np.asarray(table.column("rewards"), np.float32),
        next_obs=next_obs,
        terminated=np.asarray(table.column("terminals")).astype(np.float32),
    )
    if not all(np.all(np.isfinite(x)) for x in (obs, action, batch.reward, next_obs)):
        raise BadInput(f"{path} holds non-finite values; clean the dataset")
    if np.any(np.abs(action) > 1.0 + 1e-6):
        raise BadInput(f"{path} holds actions outside [-1, 1]; scale them to the env's normalised action range")
    return batch, meta
