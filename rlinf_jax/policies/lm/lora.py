"""LoRA (Hu et al., 2021) on a model's projections, kept outside the model.

The model stays the plain `CausalLM`; its parameters are split into the frozen base and
low-rank adapters ``{kernel path: {"a": [in, r], "b": [r, out]}}`` for every attention and
MLP projection. The trainers differentiate only the adapters and build the weights they
run as ``W + (alpha / r) * A @ B`` (``merge``), inside their jitted steps. ``B`` starts at
zero, so the first forward pass is the base model's exactly; ``A`` starts Gaussian with
std ``1 / r``. Adapter keys join the kernel's path with ``:`` (checkpoint paths use dots).

The rollout receives merged weights (the sampler runs a plain model); checkpoints hold the
base and the adapters, and loading an LoRA run's checkpoint as ``actor.model.path`` merges
them (``merge_host``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# Projections that get adapters: attention q/k/v/o and the MLP's gate/up/down kernels.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def adapter_key(path) -> str:
    return ":".join(str(p) for p in path)


def target_paths(state) -> list[str]:
    """Adapter keys of the kernels of ``state`` (an nnx.State) that take adapters."""
    return [
        adapter_key(path)
        for path, _ in nnx.to_flat_state(state)
        if path[-1] == "kernel" and len(path) >= 2 and path[-2] in TARGETS
    ]


class LoRA:
    def __init__(self, base_state, rank: int, alpha: float):
        self.rank, self.alpha = int(rank), float(alpha)
        self.scale = self.alpha / self.rank
        self.targets = target_paths(base_state)
        self.shapes = {adapter_key(p): v.get_value().shape for p, v in nnx.to_flat_state(base_state)}

    def init(self, key) -> dict:
        adapters = {}
        for i, path in enumerate(self.targets):
            d_in, d_out = self.shapes[path]
            a = jax.random.normal(jax.random.fold_in(key, i), (d_in, self.rank), jnp.float32) / self.rank
            adapters[path] = {"a": a, "b": jnp.zeros((self.rank, d_out), jnp.float32)}
        return adapters

    def merge(self, base, adapters):
        """The base state with ``W + scale * A @ B`` in every adapted kernel (jit-friendly)."""
        flat = []
        for path, var in nnx.to_flat_state(base):
            ad = adapters.get(adapter_key(path))
            if ad is not None:
                w = var.get_value()
                var = var.replace(w + (self.scale * (ad["a"] @ ad["b"])).astype(w.dtype))
            flat.append((path, var))
        return nnx.from_flat_state(flat)

    def meta(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha}


def merge_host(stored: dict[str, np.ndarray], lora_flat: dict[str, np.ndarray], meta: dict) -> dict[str, np.ndarray]:
    """Merges a checkpoint's adapters (flattened ``<adapter key>.a`` / ``.b``) into its
    flattened base parameters (dotted keys), on the host."""
    scale = float(meta["alpha"]) / int(meta["rank"])
    out = dict(stored)
    for key, w in stored.items():
        name = key.replace(".", ":")
        a, b = lora_flat.get(f"{name}.a"), lora_flat.get(f"{name}.b")
        if a is not None and b is not None:
            out[key] = (np.asarray(w, np.float32) + scale * np.asarray(a, np.float32) @ np.asarray(b, np.float32)).astype(
                np.asarray(w).dtype
            )
    return out
