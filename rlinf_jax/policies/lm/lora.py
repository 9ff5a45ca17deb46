"""LoRA (Hu et al., 2021) on a model's projections, kept outside the model.

The model stays the plain `CausalLM`; its parameters are split into the frozen base and
low-rank adapters ``{kernel path: {"a": [in, r], "b": [r, out]}}`` for every attention and
MLP projection. The trainers differentiate only the adapters and build the weights they
run as ``W + (alpha / r) * A @ B`` (``merge``), inside their jitted steps. ``B`` starts at
zero, so the first forward pass is the base model's exactly; ``A`` starts Gaussian with
std ``1 / r``. Adapter keys join the kernel's path with ``:`` (checkpoint paths use dots).

A scanned model's stacked kernels ``[L, in, out]`` get stacked adapters, ``[L, in, r]`` and
``[L, r, out]`` (the merge's product is batched over the layers), drawn as the unrolled
model's adapters of the same layers: the same seed trains the same numbers in either layout.

The rollout receives merged weights (the sampler runs a plain model); checkpoints hold the
base and the adapters, and loading an LoRA run's checkpoint as ``actor.model.path`` merges
them (``merge_host``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.policies.lm.layout import LAYERS

# Projections that get adapters: attention q/k/v/o and the MLP's gate/up/down kernels.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def adapter_key(path) -> str:
    return ":".join(str(p) for p in path)


def unrolled_key(key: str, layer: int) -> str:
    """The unrolled model's adapter key of ``layer`` of a stacked kernel's key."""
    head, _, rest = key.partition(":")
    if head != LAYERS:
        raise ValueError(f"{key} is not a stacked layer kernel (its path does not start with {LAYERS})")
    return f"{LAYERS}:{layer}:{rest}"


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
        draws = self._draw_order()
        adapters = {}
        for path in self.targets:
            *layers, d_in, d_out = self.shapes[path]
            if not layers:
                adapters[path] = self._pair(key, draws[path], d_in, d_out)
                continue
            pairs = [self._pair(key, draws[unrolled_key(path, i)], d_in, d_out) for i in range(layers[0])]
            adapters[path] = {part: jnp.stack([p[part] for p in pairs]) for part in ("a", "b")}
        return adapters

    def _pair(self, key, i: int, d_in: int, d_out: int) -> dict:
        a = jax.random.normal(jax.random.fold_in(key, i), (d_in, self.rank), jnp.float32) / self.rank
        return {"a": a, "b": jnp.zeros((self.rank, d_out), jnp.float32)}

    def _draw_order(self) -> dict[str, int]:
        """The number of each adapter's random draw: its place among the targets, and for a
        stacked kernel's layers their places among the unrolled model's targets (whose
        flat-state order is that of their sorted paths)."""
        if all(len(self.shapes[path]) == 2 for path in self.targets):
            return {path: i for i, path in enumerate(self.targets)}
        paths = []
        for path in self.targets:
            *layers, _, _ = self.shapes[path]
            paths += [unrolled_key(path, i) for i in range(layers[0])] if layers else [path]
        ordered = sorted(paths, key=lambda k: tuple(int(p) if p.isdigit() else p for p in k.split(":")))
        return {k: i for i, k in enumerate(ordered)}

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
