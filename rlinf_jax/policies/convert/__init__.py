"""Torch checkpoints -> our Flax models, one converter per ``config.json`` ``model_type``.

Each entry names a module and two of its functions: ``convert(src_dir, out_dir, dtype)``
writes a converted directory (``config.json`` + Orbax ``params/``) and returns its path;
``load(path, dtype=None)`` builds the model from such a directory. Modules are imported on
first use, so asking for one family never imports the others (or torch-side code).

``python -m rlinf_jax.convert`` dispatches through ``convert``; code that holds a converted
directory calls ``load_converted``.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.hf_checkpoint import read_hf_config


@dataclasses.dataclass(frozen=True)
class Entry:
    module: str
    convert: str = "convert"
    load: str = "load"

    def functions(self):
        mod = importlib.import_module(self.module)
        return getattr(mod, self.convert), getattr(mod, self.load)


_LM = Entry("rlinf_jax.policies.lm.converted", "convert", "load_converted")
_VISION = Entry("rlinf_jax.policies.convert.vision")

REGISTRY: dict[str, Entry] = {
    "llama": _LM,
    "qwen2": _LM,
    "qwen3": _LM,
    "siglip_vision_model": _VISION,
    "siglip": _VISION,
    "dinov2_with_registers": _VISION,
    "dinov2": _VISION,
    "openvla": Entry("rlinf_jax.policies.convert.openvla"),
    "gemma": Entry("rlinf_jax.policies.convert.gemma"),
    "paligemma": Entry("rlinf_jax.policies.convert.pi0", "convert_paligemma", "load_paligemma"),
    "pi0": Entry("rlinf_jax.policies.convert.pi0"),
    "pi05": Entry("rlinf_jax.policies.convert.pi05"),
    "gr00t_n1_5": Entry("rlinf_jax.policies.convert.gr00t"),
}


def register(model_type: str, module: str, convert: str = "convert", load: str = "load") -> None:
    """Add (or replace) the converter of ``model_type``."""
    REGISTRY[model_type] = Entry(module, convert, load)


def entry(model_type: str | None) -> Entry:
    if model_type not in REGISTRY:
        raise BadInput(
            f"config.json model_type={model_type!r} has no converter; supported: {', '.join(sorted(REGISTRY))}"
        )
    return REGISTRY[model_type]


# lerobot policy configs name their family in ``type``; these are the ones converted here.
LEROBOT_TYPES = ("pi05",)


def model_type_of(path) -> str | None:
    """config.json's ``model_type`` (transformers), or for lerobot's policy configs their
    ``type`` where it is one of `LEROBOT_TYPES`."""
    hf = read_hf_config(path)
    if hf.get("model_type"):
        return hf["model_type"]
    kind = hf.get("type")
    if kind is not None and kind not in LEROBOT_TYPES:
        raise BadInput(f"config.json is a lerobot {kind!r} policy; of lerobot's policies only "
                       f"{', '.join(LEROBOT_TYPES)} convert here "
                       "(pi0: convert transformers' PI0ForConditionalGeneration; groot: convert the "
                       "GR00T-N1.5 checkpoint its base_model_path names)")
    return kind


def convert(src, out_dir, dtype: str = "auto") -> Path:
    """Convert the checkpoint directory ``src`` with the converter its model_type names."""
    fn, _ = entry(model_type_of(src)).functions()
    return fn(src, out_dir, dtype)


def load_converted(path, dtype=None):
    """The model in converted directory ``path``, whatever its family."""
    _, fn = entry(model_type_of(path)).functions()
    return fn(path, dtype=dtype)
