"""Networks of the off-policy family in Flax NNX: a tanh-Gaussian actor, an ensemble of Q
critics evaluated in one batched pass (optionally with LayerNorm, RLPD's choice, or batch
renormalisation, CrossQ's), and a state-value MLP (IQL).

The ensemble keeps its members' weights stacked (``[N, in, out]``), so N critics cost one
batched matrix product per layer rather than N small ones; members are initialised
independently. Batch renormalisation (Ioffe 2017) keeps running statistics in
``nnx.BatchStat`` variables: in training mode it normalises with the batch's statistics,
corrected towards the running ones by the clipped factors r and d once
``warmup_steps`` updates have built those up (before that it is plain batch
normalisation), and moves the running statistics; in evaluation mode it uses them.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax import kernels
from rlinf_jax.policies import distributions as dist
from rlinf_jax.policies.mlp import MLP, get_activation


def _member_init():
    # fan-in of one member's layer, not of the stacked [N, in, out] array.
    return nnx.initializers.variance_scaling(1.0, "fan_in", "uniform", in_axis=-2, out_axis=-1, batch_axis=(0,))


class EnsembleLinear(nnx.Module):
    """``N`` independent dense layers: ``[N, B, in] -> [N, B, out]`` (or ``[B, in]`` shared).

    ``dtype`` / ``matmul``: the products' compute dtype and backend (`rlinf_jax.kernels`),
    accumulated in float32; parameters, bias and output stay float32.
    """

    def __init__(self, num: int, in_features: int, out_features: int, *, rngs: nnx.Rngs, dtype=jnp.float32,
                 matmul: str = "xla"):
        self.kernel = nnx.Param(_member_init()(rngs.params(), (num, in_features, out_features)))
        self.bias = nnx.Param(jnp.zeros((num, 1, out_features)))
        self.dtype, self.matmul = dtype, matmul

    def __call__(self, x):
        kernel = self.kernel[...]
        if self.matmul == "xla" and jnp.dtype(self.dtype) == jnp.float32:
            spec = "bi,nio->nbo" if x.ndim == 2 else "nbi,nio->nbo"
            return jnp.einsum(spec, x, kernel) + self.bias[...]
        if x.ndim == 2:
            x = jnp.broadcast_to(x[None], (kernel.shape[0], *x.shape))
        y = kernels.matmul(x, kernel, self.matmul, compute_dtype=self.dtype)
        return kernels.add_bias(y, self.bias[...], self.matmul)


class EnsembleLayerNorm(nnx.Module):
    """LayerNorm over features with a scale and bias per member."""

    def __init__(self, num: int, features: int, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.ones((num, 1, features)))
        self.bias = nnx.Param(jnp.zeros((num, 1, features)))
        self.eps = eps

    def __call__(self, x):
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.var(x, axis=-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + self.eps) * self.scale[...] + self.bias[...]


class BatchRenorm(nnx.Module):
    """Batch renormalisation over the batch axis of ``[..., B, F]``, per leading index.

    ``shape``: the statistics' shape, e.g. ``(N, 1, F)`` for an ensemble's ``[N, B, F]``.
    ``train=True`` uses (and moves) batch statistics; ``False`` the running ones.
    """

    def __init__(self, shape: tuple[int, ...], momentum: float = 0.99, warmup_steps: int = 100_000,
                 r_max: float = 3.0, d_max: float = 5.0, eps: float = 1e-3):
        self.mean = nnx.BatchStat(jnp.zeros(shape))
        self.var = nnx.BatchStat(jnp.ones(shape))
        self.steps = nnx.BatchStat(jnp.zeros((), jnp.int32))
        self.scale = nnx.Param(jnp.ones(shape))
        self.bias = nnx.Param(jnp.zeros(shape))
        self.momentum, self.warmup_steps, self.r_max, self.d_max, self.eps = momentum, warmup_steps, r_max, d_max, eps

    def __call__(self, x, train: bool):
        if train:
            mean = jnp.mean(x, axis=-2, keepdims=True)
            var = jnp.var(x, axis=-2, keepdims=True)
            running_std = jnp.sqrt(self.var[...] + self.eps)
            std = jnp.sqrt(var + self.eps)
            r = jax.lax.stop_gradient(jnp.clip(std / running_std, 1.0 / self.r_max, self.r_max))
            d = jax.lax.stop_gradient(jnp.clip((mean - self.mean[...]) / running_std, -self.d_max, self.d_max))
            warmed = (self.steps[...] >= self.warmup_steps).astype(x.dtype)
            # Renormalised: ((x - mean) / std) * r + d; during warm-up r = 1, d = 0.
            r = warmed * r + (1.0 - warmed)
            d = warmed * d
            y = (x - mean) / std * r + d
            self.mean[...] = self.momentum * self.mean[...] + (1.0 - self.momentum) * jax.lax.stop_gradient(mean)
            self.var[...] = self.momentum * self.var[...] + (1.0 - self.momentum) * jax.lax.stop_gradient(var)
            self.steps[...] = self.steps[...] + 1
        else:
            y = (x - self.mean[...]) / jnp.sqrt(self.var[...] + self.eps)
        return y * self.scale[...] + self.bias[...]


class QEnsemble(nnx.Module):
    """``N`` critics Q(s, a): ``(obs [B, O], action [B, A]) -> [N, B]``.

    ``norm``: "none", "layer" (LayerNorm after every hidden layer, before the activation,
    as RLPD) or "batch_renorm" (CrossQ: on the input and after every hidden activation).
    """

    def __init__(self, obs_size: int, action_size: int, hidden_sizes: Sequence[int], num: int = 2,
                 activation: str = "relu", norm: str = "none", renorm_momentum: float = 0.99,
                 renorm_warmup: int = 100_000, *, rngs: nnx.Rngs, dtype=jnp.float32, matmul: str = "xla"):
        if norm not in ("none", "layer", "batch_renorm"):
            raise ValueError(f"unknown critic normalisation {norm!r}")
        sizes = [obs_size + action_size, *hidden_sizes]
        kw = {"rngs": rngs, "dtype": dtype, "matmul": matmul}
        self.layers = nnx.List([EnsembleLinear(num, a, b, **kw) for a, b in zip(sizes[:-1], sizes[1:])])
        self.out = EnsembleLinear(num, sizes[-1], 1, **kw)
        self.norm, self.num = norm, num
        self.activation = get_activation(activation)
        if norm == "layer":
            self.norms = nnx.List([EnsembleLayerNorm(num, b) for b in hidden_sizes])
        elif norm == "batch_renorm":
            renorm = lambda f: BatchRenorm((num, 1, f), renorm_momentum, renorm_warmup)  # noqa: E731
            self.input_norm = renorm(sizes[0])
            self.norms = nnx.List([renorm(b) for b in hidden_sizes])

    def __call__(self, obs, action, train: bool = False):
        x = jnp.concatenate([obs, action], axis=-1)
        x = jnp.broadcast_to(x[None], (self.num, *x.shape))
        if self.norm == "batch_renorm":
            x = self.input_norm(x, train)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if self.norm == "layer":
                x = self.activation(self.norms[i](x))
            elif self.norm == "batch_renorm":
                x = self.norms[i](self.activation(x), train)
            else:
                x = self.activation(x)
        return self.out(x)[..., 0]


class SquashedGaussianActor(nnx.Module):
    """``obs -> (loc, scale)`` of a Gaussian whose sample is squashed by tanh into the
    action box (scale = softplus(raw) + min_std, Brax's parametrisation)."""

    def __init__(self, obs_size: int, action_size: int, hidden_sizes: Sequence[int], activation: str = "relu",
                 min_std: float = 0.001, *, rngs: nnx.Rngs, dtype=jnp.float32, matmul: str = "xla"):
        self.net = MLP([obs_size, *hidden_sizes, 2 * action_size], get_activation(activation), rngs=rngs,
                       dtype=dtype, matmul=matmul)
        self.min_std = min_std

    def __call__(self, obs):
        loc, raw_scale = jnp.split(self.net(obs), 2, axis=-1)
        return loc, jax.nn.softplus(raw_scale) + self.min_std


def sample_action(actor: SquashedGaussianActor, obs, key):
    """A reparameterised sample: ``(action in [-1, 1], log pi(action | obs))``, the log-prob
    with the tanh change of variables. ``key``: one key, or one per row."""
    loc, scale = actor(obs)
    raw = dist.tanh_normal_sample(loc, scale, key)
    return jnp.tanh(raw), dist.tanh_normal_log_prob(loc, scale, raw)


def action_logprob(actor: SquashedGaussianActor, obs, action, clip: float = 1e-6):
    """``log pi(a | obs)`` of env actions ``a`` in [-1, 1] (datasets store the squashed
    action): the raw sample is ``atanh(a)``, taken inside ``[-1 + clip, 1 - clip]``."""
    loc, scale = actor(obs)
    raw = jnp.arctanh(jnp.clip(action, -1.0 + clip, 1.0 - clip))
    return dist.tanh_normal_log_prob(loc, scale, raw)


def deterministic_action(actor: SquashedGaussianActor, obs):
    loc, _ = actor(obs)
    return jnp.tanh(loc)


class ValueMLP(nnx.Module):
    """V(s): ``obs [B, O] -> [B]`` (IQL), with LayerNorm when asked."""

    def __init__(self, obs_size: int, hidden_sizes: Sequence[int], activation: str = "relu",
                 layer_norm: bool = False, *, rngs: nnx.Rngs):
        sizes = [obs_size, *hidden_sizes, 1]
        init = nnx.initializers.lecun_uniform()
        self.layers = nnx.List([nnx.Linear(a, b, kernel_init=init, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:])])
        self.norms = nnx.List([nnx.LayerNorm(b, rngs=rngs) for b in hidden_sizes]) if layer_norm else None
        self.activation = get_activation(activation)

    def __call__(self, obs):
        x = obs
        for i, layer in enumerate(self.layers[:-1]):
            x = layer(x)
            if self.norms is not None:
                x = self.norms[i](x)
            x = self.activation(x)
        return self.layers[-1](x)[..., 0]
