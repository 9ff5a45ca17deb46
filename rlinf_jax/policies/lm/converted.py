"""Converted checkpoints: a model's parameters as an Orbax checkpoint next to its
``config.json``, the form a trainer starts from (``actor.model.path``).

Layout of a converted directory::

    config.json     the Hugging Face config, copied unchanged
    params/         Orbax StandardCheckpointer tree: nested dict of parameter arrays
    (tokenizer files, generation_config.json: copied when the source had them)

The parameter tree is a plain nested dict (``nnx.to_pure_dict``), so reading it needs Orbax
and nothing of this package.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.hf_checkpoint import (
    abstract_model,
    dotted,
    fill_model,
    flatten_tree,
    from_pretrained,
    layer_placement,
    parse_dtype,
    placement_by_path,
    read_hf_config,
    stack_placed,
)
from rlinf_jax.policies.lm.layout import stack_flat
from rlinf_jax.policies.lm.model import CausalLM

PARAMS_DIR = "params"
# Files worth carrying along so the converted directory is self-contained for a run.
SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
)


def source_dtype(hf_config: dict) -> str:
    """The dtype a checkpoint was saved in, per its config (float32 if unsaid)."""
    name = hf_config.get("dtype") or hf_config.get("torch_dtype") or "float32"
    return name if name in ("float32", "bfloat16", "float16") else "float32"


def convert(src, out_dir, dtype: str = "auto") -> Path:
    """HF directory ``src`` -> converted directory ``out_dir`` (must be absent or empty)."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(f"{out} exists and is not empty; choose a new output directory")
    hf = read_hf_config(src)
    dtype = source_dtype(hf) if dtype == "auto" else dtype
    model = from_pretrained(src, dtype=parse_dtype(dtype))
    out.mkdir(parents=True, exist_ok=True)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save((out / PARAMS_DIR).absolute(), params)
        ckptr.wait_until_finished()
    shutil.copyfile(Path(src) / "config.json", out / "config.json")
    for name in SIDE_FILES:
        if (Path(src) / name).is_file():
            shutil.copyfile(Path(src) / name, out / name)
    return out


def load_converted(path, dtype=None, shardings=None, scan_layers: bool = False) -> CausalLM:
    """The model stored by ``convert`` (or ``python -m rlinf_jax.convert``).

    ``dtype`` (compute dtype) defaults to the stored parameters' dtype; ``shardings`` as in
    ``from_pretrained``. The directory holds the unrolled layout; ``scan_layers`` stacks the
    blocks for a scan once they are read (`policies.lm.layout`).
    """
    d = Path(path)
    hf = read_hf_config(d)
    if not (d / PARAMS_DIR).is_dir():
        raise BadInput(f"{d} has no {PARAMS_DIR}/ directory; create it with python -m rlinf_jax.convert")
    config = LMConfig.from_hf_config(hf)
    with ocp.StandardCheckpointer() as ckptr:
        stored = ckptr.metadata((d / PARAMS_DIR).absolute()).item_metadata
        param_dtype = _stored_dtype(stored)
        compute = parse_dtype(dtype) if dtype is not None else param_dtype
        graphdef, abstract_state = nnx.split(abstract_model(config, compute, param_dtype))
        placement = shardings
        if scan_layers:
            # The stored layers are restored onto their rows of the stacked parameters' shardings.
            scanned_graphdef, scanned_state = nnx.split(abstract_model(config, compute, param_dtype, scan_layers=True))
            stacked_placement = placement_by_path(shardings, {dotted(p) for p, _ in nnx.to_flat_state(scanned_state)})
            placement = layer_placement(stacked_placement, config.num_layers)
        target = nnx.to_pure_dict(abstract_state)
        target = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), target, _placement_tree(target, placement)
        )
        try:
            restored = ckptr.restore((d / PARAMS_DIR).absolute(), target)
        except (ValueError, KeyError) as e:
            raise BadInput(f"{d / PARAMS_DIR} does not match config.json ({str(e).splitlines()[0]})") from None
    nnx.replace_by_pure_dict(abstract_state, restored)
    if not scan_layers:
        return nnx.merge(graphdef, abstract_state)
    values = {dotted(p): v.get_value() for p, v in nnx.to_flat_state(abstract_state)}
    values = stack_flat(values, config.num_layers, stack=functools.partial(stack_placed, stacked_placement))
    return fill_model(scanned_graphdef, scanned_state, values)


def _stored_dtype(metadata) -> jnp.dtype:
    dtypes = {jnp.dtype(leaf.dtype) for leaf in jax.tree.leaves(metadata) if hasattr(leaf, "dtype")}
    if len(dtypes) != 1:
        raise BadInput(f"converted parameters mix dtypes {sorted(map(str, dtypes))}; expected one")
    return dtypes.pop()


def _placement_tree(target, shardings):
    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    if shardings is None:
        return jax.tree.map(lambda _: default, target)
    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda _: shardings, target)
    flat = flatten_tree(shardings)

    def pick(path, _):
        key = ".".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path)
        return flat.get(key, default)

    return jax.tree_util.tree_map_with_path(pick, target)
