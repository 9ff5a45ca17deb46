"""Gaussian MLP actor-critic in Flax NNX for state-based control.

The policy network outputs the mean and a raw scale per action dimension
(scale = softplus(raw) + min_std, Brax's parametrisation); the value network is separate,
so the two can have different widths.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax import kernels
from rlinf_jax.errors import BadInput
from rlinf_jax.policies import distributions as dist

ACTIVATIONS = {
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "swish": jax.nn.swish,
    "silu": jax.nn.silu,
    "gelu": jax.nn.gelu,
    "elu": jax.nn.elu,
}


def get_activation(name: str):
    if name not in ACTIVATIONS:
        raise BadInput(f"actor.model.activation={name!r} is unknown; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class MLP(nnx.Module):
    """Dense layers; ``dtype`` is the compute dtype (float32 parameters either way), and the
    output is float32 whatever it is.

    ``matmul`` other than ``xla`` (`rlinf_jax.kernels`) runs each layer's product through that
    backend in ``dtype``, accumulated and returned in float32; biases and activations then
    stay float32.
    """

    def __init__(self, sizes: Sequence[int], activation, *, rngs: nnx.Rngs, dtype=jnp.float32, matmul: str = "xla"):
        init = nnx.initializers.lecun_uniform()
        self.layers = nnx.List([
            nnx.Linear(a, b, kernel_init=init, dtype=dtype, param_dtype=jnp.float32, rngs=rngs)
            for a, b in zip(sizes[:-1], sizes[1:])
        ])
        self.activation = activation
        self.dtype, self.matmul = dtype, matmul

    def __call__(self, x):
        lead = x.shape[:-1]
        if self.matmul != "xla":
            x = x.reshape(-1, x.shape[-1])
        for i, layer in enumerate(self.layers):
            if self.matmul == "xla":
                x = layer(x)
            else:
                x = kernels.matmul(x, layer.kernel[...], self.matmul, compute_dtype=self.dtype)
                x = kernels.add_bias(x, layer.bias[...], self.matmul)
            if i < len(self.layers) - 1:
                x = self.activation(x)
        return x.astype(jnp.float32).reshape(*lead, -1)


class ActorCritic(nnx.Module):
    def __init__(
        self,
        obs_size: int,
        action_size: int,
        policy_hidden_sizes: Sequence[int] = (32, 32, 32, 32),
        value_hidden_sizes: Sequence[int] = (256, 256, 256, 256, 256),
        activation: str = "swish",
        min_std: float = 0.001,
        init_log_std: float = 0.0,
        *,
        rngs: nnx.Rngs,
        compute_dtype: str = "float32",
    ):
        act = get_activation(activation)
        dtype = jnp.dtype(compute_dtype)
        self.policy = MLP([obs_size, *policy_hidden_sizes, 2 * action_size], act, rngs=rngs, dtype=dtype)
        self.value = MLP([obs_size, *value_hidden_sizes, 1], act, rngs=rngs, dtype=dtype)
        self.action_size = action_size
        self.min_std = min_std
        # Shifts softplus so that a zero raw output gives std = exp(init_log_std). Host
        # float32 arithmetic: a constant, with no XLA program compiled to build the model.
        self.scale_shift = float(np.log(np.expm1(np.exp(np.float32(init_log_std)))))

    def distribution(self, obs):
        out = self.policy(obs)
        loc, raw_scale = jnp.split(out, 2, axis=-1)
        scale = jax.nn.softplus(raw_scale + self.scale_shift) + self.min_std
        return loc, scale

    def critic(self, obs):
        return self.value(obs)[..., 0]


def act(model: ActorCritic, obs, key):
    """Samples an action. Returns (env action in [-1, 1], raw pre-tanh action, log-prob)."""
    loc, scale = model.distribution(obs)
    raw = dist.tanh_normal_sample(loc, scale, key)
    return jnp.tanh(raw), raw, dist.tanh_normal_log_prob(loc, scale, raw)


def act_deterministic(model: ActorCritic, obs):
    loc, _ = model.distribution(obs)
    return jnp.tanh(loc)


def evaluate_actions(model: ActorCritic, obs, raw, key):
    """Log-prob of stored raw actions, entropy estimate and value: what the PPO loss needs."""
    loc, scale = model.distribution(obs)
    return (
        dist.tanh_normal_log_prob(loc, scale, raw),
        dist.tanh_normal_entropy(loc, scale, key),
        model.critic(obs),
    )
