"""Heads and adapters for RL on the VLA backbones.

``ValueHead``: the critic, an MLP on one hidden state of the LM: the last prompt token,
right before the first action token (OpenVLA: ``forward_actions(...).value_hidden``;
OFT: ``forward_chunk(...).value_hidden``). RLinf's sizes: ``hidden -> 512 -> 128 -> 1``
with GELU. The output layer starts at zero so a fresh critic predicts 0 everywhere.

``BackboneLoRA``: low-rank adapters on the projections of any backbone (LM, vision
towers, projector). It is ``policies.lm.lora.LoRA`` (frozen base, ``W + alpha / r * A
@ B`` merged inside the jitted step, ``B = 0`` at the start) with the adapted kernels chosen
by module name *and* path prefix, so e.g. only the LM, or the LM and the projector, get
adapters while the ViTs stay frozen.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.lora import LoRA, adapter_key
from rlinf_jax.policies.lm.layers import INIT_STD, param


class ValueHead(nnx.Module):
    def __init__(self, hidden: int, sizes: Sequence[int] = (512, 128), *, dtype=jnp.float32, rngs: nnx.Rngs):
        dims = (hidden, *sizes, 1)
        self.dtype = dtype
        self.kernels, self.biases = nnx.List(), nnx.List()
        for i, (a, b) in enumerate(itertools.pairwise(dims)):
            last = i == len(dims) - 2
            init = nnx.initializers.zeros if last else nnx.initializers.normal(INIT_STD)
            self.kernels.append(param(rngs, init, (a, b), jnp.float32, (None, None)))
            self.biases.append(param(rngs, nnx.initializers.zeros, (b,), jnp.float32, (None,)))

    def __call__(self, hidden: jax.Array) -> jax.Array:
        """Values ``[...]`` (float32) from hidden states ``[..., hidden]``."""
        h = hidden.astype(jnp.float32)
        n = len(self.kernels)
        for i, (w, b) in enumerate(zip(self.kernels, self.biases, strict=True)):
            h = h @ w[...] + b[...]
            if i < n - 1:
                h = jax.nn.gelu(h, approximate=False)
        return h[..., 0]


# Projections that take adapters: attention and MLP projections of the LM and the ViTs,
# and the projector's layers.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "fc1", "fc2", "fc3")


class BackboneLoRA(LoRA):
    """``LoRA`` on the 2-D kernels of modules named in ``targets`` whose path starts with one
    of ``prefixes`` (dotted, e.g. ``"llm"`` or ``"vla.llm"``; empty: everywhere)."""

    def __init__(
        self,
        base_state,
        rank: int,
        alpha: float,
        *,
        targets: Sequence[str] = DEFAULT_TARGETS,
        prefixes: Sequence[str] = ("",),
    ):
        super().__init__(base_state, rank, alpha)
        chosen = []
        for path, var in nnx.to_flat_state(base_state):
            dotted = ".".join(str(p) for p in path)
            if (
                path[-1] == "kernel"
                and len(path) >= 2
                and path[-2] in targets
                and len(var.get_value().shape) == 2
                and any(dotted == p or dotted.startswith(p + ".") or not p for p in prefixes)
            ):
                chosen.append(adapter_key(path))
        if not chosen:
            raise BadInput(f"LoRA found no kernels named {', '.join(targets)} under {', '.join(prefixes)}")
        self.targets = chosen
