"""A fixed set of transitions on devices (demonstrations, an offline dataset), sampled
uniformly under `jit`: the data RLPD mixes into every batch and IQL trains on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from rlinf_jax.replay.buffer import TransitionBatch


@struct.dataclass
class TransitionDataset:
    data: TransitionBatch  # [N, ...]

    @property
    def size(self) -> int:
        return self.data.size

    def sample(self, key, n: int) -> TransitionBatch:
        """``n`` transitions drawn uniformly with replacement."""
        rows = jax.random.randint(key, (n,), 0, self.size)
        return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), self.data)

    @classmethod
    def from_arrays(cls, batch: TransitionBatch) -> TransitionDataset:
        return cls(jax.tree.map(jnp.asarray, batch))
