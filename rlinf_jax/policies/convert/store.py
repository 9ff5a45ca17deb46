"""Converted VLA checkpoints on disk: ``config.json`` (the source's, copied) plus ``params/``,
an Orbax tree of the parameters as a nested dict, the same layout as converted language
models (``policies.lm.converted``), so a trainer reads every family the same way.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.convert import keys
from rlinf_jax.policies.lm.hf_checkpoint import dotted, fill_model, parse_dtype, read_hf_config, safetensors_files

PARAMS_DIR = "params"
SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
    "preprocessor_config.json",
    "dataset_statistics.json",
)


def resolve_dtype(hf_config: dict, dtype) -> jnp.dtype:
    """``"auto"`` is the dtype the source was saved in per its config (float32 if unsaid)."""
    if dtype in (None, "auto"):
        name = hf_config.get("dtype") or hf_config.get("torch_dtype") or "float32"
        dtype = name if name in ("float32", "bfloat16", "float16") else "float32"
    return parse_dtype(dtype)


def check_empty(out_dir) -> Path:
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(f"{out} exists and is not empty; choose a new output directory")
    return out


def save_converted(model: nnx.Module, src, out_dir, hf_config: dict | None = None) -> Path:
    """Write ``model``'s parameters and ``src``'s config.json (or ``hf_config``) to ``out_dir``."""
    out = check_empty(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save((out / PARAMS_DIR).absolute(), params)
        ckptr.wait_until_finished()
    if hf_config is None:
        shutil.copyfile(Path(src) / "config.json", out / "config.json")
    else:
        (out / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    for name in SIDE_FILES:
        if (Path(src) / name).is_file():
            shutil.copyfile(Path(src) / name, out / name)
    return out


def load_converted(path, build: Callable[[dict, jnp.dtype, jnp.dtype], nnx.Module], dtype=None) -> nnx.Module:
    """The model ``build(hf_config, compute_dtype, param_dtype)`` describes, with the stored
    parameters; ``dtype`` (compute) defaults to the stored one."""
    d = Path(path)
    hf = read_hf_config(d)
    if not (d / PARAMS_DIR).is_dir():
        raise BadInput(f"{d} has no {PARAMS_DIR}/ directory; create it with python -m rlinf_jax.convert")
    with ocp.StandardCheckpointer() as ckptr:
        stored = ckptr.metadata((d / PARAMS_DIR).absolute()).item_metadata
        dtypes = {jnp.dtype(leaf.dtype) for leaf in jax.tree.leaves(stored) if hasattr(leaf, "dtype")}
        if len(dtypes) != 1:
            raise BadInput(f"converted parameters mix dtypes {sorted(map(str, dtypes))}; expected one")
        param_dtype = dtypes.pop()
        compute = parse_dtype(dtype) if dtype is not None else param_dtype
        graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: build(hf, compute, param_dtype)))
        target = nnx.to_pure_dict(abstract_state)
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), target)
        try:
            restored = ckptr.restore((d / PARAMS_DIR).absolute(), target)
        except (ValueError, KeyError) as e:
            raise BadInput(f"{d / PARAMS_DIR} does not match config.json ({str(e).splitlines()[0]})") from None
    nnx.replace_by_pure_dict(abstract_state, restored)
    return nnx.merge(graphdef, abstract_state)


def model_from_checkpoint(path, build: Callable, hf: dict, key_map, what: str, dtype, param_dtype=None):
    """``build(hf, dtype, param_dtype)`` laid out abstractly and filled from the safetensors
    files of ``path`` through the rows and skips ``key_map`` gives: every checkpoint key
    consumed or skipped by name, every parameter found, shapes checked (`keys.read_checkpoint`)."""
    param_dtype = param_dtype or dtype
    graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: build(hf, dtype, param_dtype)))
    targets = {dotted(p): v.get_value() for p, v in nnx.to_flat_state(abstract_state)}
    rows, skips = key_map
    values = keys.read_checkpoint(safetensors_files(path), rows, skips, targets, what, dtype=param_dtype)
    return fill_model(graphdef, abstract_state, {k: jnp.asarray(v) for k, v in values.items()})


def convert_directory(from_pretrained: Callable, src, out_dir, dtype="auto") -> Path:
    """``from_pretrained(src, dtype=...)`` written as a converted directory ``out_dir`` (which
    must be new or empty: nothing already there is overwritten)."""
    check_empty(out_dir)
    model = from_pretrained(src, dtype=resolve_dtype(read_hf_config(src), dtype))
    return save_converted(model, src, out_dir)
