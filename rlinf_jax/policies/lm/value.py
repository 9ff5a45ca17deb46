"""PPO's value model for language models: the policy's trunk with a scalar head."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from rlinf_jax.policies.lm.model import CausalLM


class ValueHead(nnx.Module):
    """A scalar per position from the LM's final hidden states."""

    def __init__(self, hidden_size: int, *, rngs: nnx.Rngs):
        self.kernel = nnx.Param(jnp.zeros((hidden_size, 1), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((1,), jnp.float32))
        del rngs  # zero init: the first values are 0 and the first advantages the returns

    def __call__(self, hidden):
        return (hidden.astype(jnp.float32) @ self.kernel[...] + self.bias[...])[..., 0]


class ValueModel(nnx.Module):
    """A causal LM trunk with a value head: V(prompt + response[:j]) for every j."""

    def __init__(self, trunk: CausalLM, *, rngs: nnx.Rngs):
        self.trunk = trunk
        self.head = ValueHead(trunk.config.hidden_size, rngs=rngs)
