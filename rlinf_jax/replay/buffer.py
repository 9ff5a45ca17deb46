"""The replay buffer: a ring of transitions on devices, written and sampled under `jit`.

It is flashbax's trajectory buffer with sequences of one item: ``add_batch_size`` rows, one
per env, each a ring over time, so a batched env step appends one transition per row and
the rows shard over the learner's batch axis like the env batch does (each device writes
its own envs' transitions). Sampling draws rows and times uniformly, i.e. every stored
transition with equal probability. The state is a plain pytree: it travels in the train
state and is saved with the checkpoint.
"""

from __future__ import annotations

import flashbax as fbx
import jax
import jax.numpy as jnp
from flax import struct

from rlinf_jax.array_types import Array, Float
from rlinf_jax.errors import BadInput


@struct.dataclass
class TransitionBatch:
    """Transitions ``[N, ...]``: what a critic and an actor update read.

    ``next_obs`` is the observation the step led to (the last one of an episode when it
    ended); ``terminated`` is 1 where the episode ended by the task (no bootstrap) and 0
    where it went on or was cut by a time limit.
    """

    # *rows: [n] for a sampled batch, [envs, time] in the buffer's rings (seeds: [seeds, ...]).
    obs: Float[Array, "*rows obs"] | dict[str, Array]
    action: Float[Array, "*rows act"]  # the env action, in [-1, 1]
    reward: Float[Array, "*rows"]
    next_obs: Float[Array, "*rows obs"] | dict[str, Array]
    terminated: Float[Array, "*rows"]

    @property
    def size(self) -> int:
        return self.reward.shape[0]


def concat_batches(a: TransitionBatch, b: TransitionBatch) -> TransitionBatch:
    return jax.tree.map(lambda x, y: jnp.concatenate([x, y]), a, b)


class ReplayBuffer:
    """``capacity`` transitions in ``num_envs`` rings; samples of ``sample_size``.

    ``capacity`` is rounded down to a multiple of ``num_envs`` (each ring holds
    ``capacity // num_envs``). Sampling from an empty buffer is the caller's to avoid
    (`size` says how many transitions are stored).
    """

    def __init__(self, capacity: int, num_envs: int, sample_size: int):
        per_env = capacity // num_envs
        if per_env < 1:
            raise BadInput(
                f"a replay buffer of {capacity} transitions cannot hold one per env of {num_envs}; raise "
                "algorithm.offpolicy.replay_size"
            )
        self.capacity, self.num_envs, self.sample_size = per_env * num_envs, num_envs, sample_size
        self._fbx = fbx.make_trajectory_buffer(
            add_batch_size=num_envs,
            sample_batch_size=sample_size,
            sample_sequence_length=1,
            period=1,
            min_length_time_axis=1,
            max_length_time_axis=per_env,
        )

    def init(self, example: TransitionBatch):
        """An empty buffer for transitions shaped like one row of ``example``."""
        return self._fbx.init(jax.tree.map(lambda x: x[0], example))

    def add(self, state, step: TransitionBatch):
        """Appends one transition per env (``step`` leaves ``[num_envs, ...]``)."""
        return self._fbx.add(state, jax.tree.map(lambda x: x[:, None], step))

    def sample(self, state, key) -> TransitionBatch:
        """``sample_size`` stored transitions, drawn uniformly with replacement."""
        return jax.tree.map(lambda x: x[:, 0], self._fbx.sample(state, key).experience)

    def size(self, state) -> jax.Array:
        """How many transitions are stored (int32)."""
        per_env = jnp.where(state.is_full, self.capacity // self.num_envs, state.current_index)
        return (per_env * self.num_envs).astype(jnp.int32)
