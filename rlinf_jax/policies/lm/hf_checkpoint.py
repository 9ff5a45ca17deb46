"""Read and write Hugging Face checkpoint directories (``config.json`` + safetensors).

Loading streams one tensor at a time from ``safe_open`` straight onto its target device /
sharding, into a model built abstractly (``nnx.eval_shape``), so host memory never holds the
checkpoint twice and no random initialisation is paid for. Every checkpoint tensor is either
mapped by ``keymap.KEY_MAP`` or explicitly ignored; everything else is a ``BadInput``.

What a directory can get wrong is refused in one line before it reaches a model: a
``config.json`` that is not an object or whose sizes are not positive integers, shard paths
that leave the directory, a damaged safetensors file, a weight stored as an integer, bool or
float64 tensor, and non-finite weights (unless `nonfinite_weights_allowed` says otherwise).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import keymap
from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.layout import layer_of, stack_flat, unstack_flat
from rlinf_jax.policies.lm.model import CausalLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


# Sizes a config.json gives the architecture: where present (at any depth: vision_config,
# text_config, ...) they must be positive integers, or building the model divides by zero or
# fails on a string. Sizes that may be 0 are listed apart.
SIZE_KEYS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "vocab_size", "head_dim", "image_size", "patch_size", "num_channels", "max_position_embeddings",
    "projection_dim",
)
ZERO_OK_SIZE_KEYS = ("num_register_tokens",)
# What a weight is stored as; anything else (integers, bool, float64) is not a weight of ours.
WEIGHT_DTYPES = ("F32", "BF16", "F16")


def _check_sizes(node, where: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            at = f"{where}.{key}" if where else str(key)
            if key in SIZE_KEYS or key in ZERO_OK_SIZE_KEYS:
                least = 0 if key in ZERO_OK_SIZE_KEYS else 1
                if isinstance(value, bool) or not isinstance(value, int) or value < least:
                    raise BadInput(f"config.json {at}={value!r} must be an integer >= {least}; fix config.json")
            else:
                _check_sizes(value, at)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_sizes(value, f"{where}[{i}]")


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        detail = str(e).splitlines()[0] if not isinstance(e, RecursionError) else "nested too deeply"
        raise BadInput(f"{path} is not valid JSON ({detail}); {what}") from None
    except OSError as e:
        raise BadInput(f"cannot read {path} ({e.strerror or e})") from None


def read_hf_config(path: str | os.PathLike) -> dict:
    d = Path(path)
    if not d.is_dir():
        raise BadInput(f"{d} is not a directory; pass a local Hugging Face model directory")
    cfg = d / "config.json"
    if not cfg.is_file():
        raise BadInput(f"{d} has no config.json; a Hugging Face model directory needs one")
    hf = _read_json(cfg, "fix or replace config.json")
    if not isinstance(hf, dict):
        raise BadInput(f"{cfg} holds a JSON {type(hf).__name__}, not an object of model settings; fix config.json")
    _check_sizes(hf, "")
    return hf


def safetensors_files(path: str | os.PathLike) -> list[Path]:
    """The checkpoint's safetensors files: the single file or the shards the index names
    (which must lie inside the directory)."""
    d = Path(path)
    if (d / SINGLE_FILE).is_file():
        return [d / SINGLE_FILE]
    if (d / INDEX_FILE).is_file():
        index = _read_json(d / INDEX_FILE, "fix or replace the index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise BadInput(f"{d / INDEX_FILE} is not a safetensors index (no weight_map of tensor -> file); fix it")
        root = d.resolve()
        files = []
        for name in dict.fromkeys(weight_map.values()):
            file = (d / name).resolve()
            if Path(name).is_absolute() or not file.is_relative_to(root) or file == root:
                raise BadInput(
                    f"{d / INDEX_FILE} names shard {name!r}, which lies outside {d}; shards must be files in the model directory"
                )
            files.append(d / name)
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise BadInput(f"{d / INDEX_FILE} names shard files that are missing: {', '.join(missing)}")
        return files
    found = sorted(p.name for p in d.iterdir()) if d.is_dir() else []
    raise BadInput(
        f"{d} has neither {SINGLE_FILE} nor {INDEX_FILE} (found: {', '.join(found) or 'nothing'}); "
        "only safetensors checkpoints are read (save with safe_serialization=True)"
    )


_ALLOW_NONFINITE = contextvars.ContextVar("rlinf_allow_nonfinite_weights", default=False)


@contextlib.contextmanager
def nonfinite_weights_allowed() -> Iterator[None]:
    """Within this block checkpoint weights may hold NaN / inf (``convert --allow-nonfinite``)."""
    token = _ALLOW_NONFINITE.set(True)
    try:
        yield
    finally:
        _ALLOW_NONFINITE.reset(token)


@contextlib.contextmanager
def open_safetensors(file: Path):
    """``safe_open`` of one file, a damaged one (truncated, garbage, a bad header) being one
    ``BadInput`` line wherever the damage shows, at opening or at reading a tensor."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="numpy") as f:
            yield f
    except SafetensorError as e:
        raise BadInput(f"{file} is not a readable safetensors file ({str(e).splitlines()[0]}); re-save or re-download it") from None
    except OSError as e:
        raise BadInput(f"cannot read {file} ({e.strerror or e})") from None


def weight_tensor(f, key: str, file: Path) -> np.ndarray:
    """Tensor ``key`` of open file ``f``, refused unless it is a float32 / bfloat16 / float16
    weight with finite values (see `nonfinite_weights_allowed`)."""
    dtype = f.get_slice(key).get_dtype()
    if dtype not in WEIGHT_DTYPES:
        raise BadInput(
            f"checkpoint tensor {key!r} ({file.name}) is stored as {dtype}, not as a weight (F32, BF16 or F16); "
            "re-save the checkpoint with floating-point weights"
        )
    array = f.get_tensor(key)
    if not _ALLOW_NONFINITE.get():
        finite = np.isfinite(array)
        if not finite.all():
            raise BadInput(
                f"checkpoint tensor {key!r} ({file.name}) holds {finite.size - int(finite.sum())} non-finite value(s) "
                f"of {finite.size}; fix the checkpoint, or pass --allow-nonfinite to convert it as it is"
            )
    return array


def parse_dtype(dtype) -> jnp.dtype:
    if isinstance(dtype, str):
        names = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
        if dtype not in names:
            raise BadInput(f"dtype {dtype!r} is not supported; choose one of {', '.join(names)}")
        return jnp.dtype(names[dtype])
    return jnp.dtype(dtype)


def abstract_model(config: LMConfig, dtype=jnp.float32, param_dtype=None, scan_layers: bool = False) -> CausalLM:
    """The model with shape-only parameters: the skeleton checkpoints are poured into."""
    return nnx.eval_shape(
        lambda: CausalLM(config, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0), scan_layers=scan_layers)
    )


def dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def flatten_tree(tree) -> dict[str, object]:
    """``{dotted path: leaf}`` for a sharding tree given as an ``nnx.State`` or nested dicts."""
    if isinstance(tree, nnx.State):
        tree = nnx.to_pure_dict(tree)
    out: dict[str, object] = {}

    def walk(node, prefix):
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, (*prefix, k))
        else:
            out[dotted(prefix)] = node

    walk(tree, ())
    return out


def fill_model(graphdef, abstract_state, values: Mapping[str, jax.Array]) -> CausalLM:
    """Merge concrete arrays (by dotted path) into the abstract state's variables."""
    flat = nnx.to_flat_state(abstract_state)
    for path, var in flat:
        var.set_value(values[dotted(path)])
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def from_pretrained(path, dtype=jnp.float32, shardings=None, param_dtype=None, scan_layers: bool = False) -> CausalLM:
    """Build a ``CausalLM`` from a local Hugging Face directory.

    ``dtype`` is the compute dtype and, unless ``param_dtype`` says otherwise, the storage
    dtype. ``shardings`` places each parameter as it is read: one ``jax.sharding.Sharding``
    for all, or a tree (``nnx.State`` / nested dict shaped like the model's parameters) of them.
    ``scan_layers``: the blocks stacked for a scan (`policies.lm.layout`); each layer's tensor
    is placed as its row of the stacked parameter, and a parameter's layers are stacked once
    all are read.
    """
    hf = read_hf_config(path)
    files = safetensors_files(path)
    config = LMConfig.from_hf_config(hf)
    dtype = parse_dtype(dtype)
    param_dtype = parse_dtype(param_dtype) if param_dtype is not None else dtype
    # Checkpoint keys map onto the unrolled layout's paths, one tensor each.
    graphdef, abstract_state = nnx.split(abstract_model(config, dtype, param_dtype))
    targets = {dotted(p): v.get_value() for p, v in nnx.to_flat_state(abstract_state)}
    if scan_layers:
        graphdef, abstract_state = nnx.split(abstract_model(config, dtype, param_dtype, scan_layers=True))
    placement = placement_by_path(shardings, {dotted(p) for p, _ in nnx.to_flat_state(abstract_state)})
    per_tensor = layer_placement(placement, config.num_layers) if scan_layers else placement

    values: dict[str, jax.Array] = {}
    for file in files:
        with open_safetensors(file) as f:
            for key in f.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                if keymap.is_ignored(key, config):
                    continue
                mapped = keymap.to_ours(key)
                if mapped is None or mapped[0] not in targets:
                    raise BadInput(
                        f"checkpoint tensor {key!r} ({file.name}) has no place in a {config.model_type} model "
                        f"with this config.json; remove it or fix the config (attention_bias, "
                        f"tie_word_embeddings, model_type)"
                    )
                target, transform = mapped
                if target in values:
                    raise BadInput(f"checkpoint tensor {key!r} appears twice (again in {file.name})")
                want = targets[target].shape
                shape = tuple(f.get_slice(key).get_shape())
                if keymap.transformed_shape(transform, shape) != tuple(want):
                    expected = keymap.transformed_shape(transform, want)
                    raise BadInput(
                        f"checkpoint tensor {key!r} has shape {shape} but config.json implies {expected}"
                    )
                host = keymap.apply(transform, weight_tensor(f, key, file)).astype(param_dtype)
                values[target] = jax.device_put(host, per_tensor.get(target))
                del host
    missing = [keymap.to_hf(p)[0] for p in targets if p not in values]
    if missing:
        raise BadInput(
            f"checkpoint {path} lacks {len(missing)} tensor(s) the config.json implies, e.g. "
            f"{', '.join(repr(k) for k in missing[:4])}"
        )
    if scan_layers:
        values = stack_flat(values, config.num_layers, stack=functools.partial(stack_placed, placement))
    return fill_model(graphdef, abstract_state, values)


def layer_placement(placement: Mapping[str, object], num_layers: int) -> dict[str, object]:
    """Shardings of a scanned model's parameters (``layers.<name>``) -> those of each layer's
    slice (``layers.<i>.<name>``): the stacked spec less its leading, never split, layer axis."""
    out = {}
    for path, sharding in placement.items():
        if not path.startswith("layers.") or layer_of(path) is not None:
            out[path] = sharding
            continue
        if isinstance(sharding, jax.sharding.NamedSharding):
            sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*sharding.spec[1:]))
        rest = path.removeprefix("layers.")
        out.update({f"layers.{i}.{rest}": sharding for i in range(num_layers)})
    return out


def stack_placed(placement: Mapping[str, object], name: str, arrays: list) -> jax.Array:
    """One parameter's layers stacked, on its sharding in ``placement`` when it has one."""
    sharding = placement.get(name)
    if sharding is None:
        return jnp.stack(arrays)
    return jax.jit(lambda *xs: jnp.stack(xs), out_shardings=sharding)(*arrays)


def placement_by_path(shardings, targets: set[str]) -> dict[str, object]:
    """``{dotted path: sharding}`` of the parameters ``targets`` names, from ``shardings`` as
    `from_pretrained` takes it ({} for None)."""
    if shardings is None:
        return {}
    if isinstance(shardings, jax.sharding.Sharding):
        return dict.fromkeys(targets, shardings)
    flat = flatten_tree(shardings)
    unknown = sorted(set(flat) - set(targets))
    if unknown:
        raise BadInput(f"shardings name parameters the model does not have: {', '.join(unknown[:4])}")
    return flat


def hf_state_dict(model: CausalLM) -> dict[str, np.ndarray]:
    """The model's parameters as host arrays under Hugging Face keys and layouts (a scanned
    model's stacked parameters one tensor per layer, as the unrolled model's)."""
    flat = {
        dotted(path): np.asarray(jax.device_get(var.get_value()))
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))
    }
    out = {}
    for path, value in (unstack_flat(flat) if model.scan_layers else flat).items():
        key, transform = keymap.to_hf(path)
        out[key] = np.ascontiguousarray(keymap.apply(transform, value))
    return out


def save_pretrained(model: CausalLM, out_dir, config: LMConfig | dict | None = None) -> Path:
    """Write ``model.safetensors`` + ``config.json`` that transformers' ``from_pretrained`` reads.

    ``config`` defaults to the model's own; an HF ``config.json`` dict is written as given
    (keeping fields such as token ids), with its ``dtype`` set to the parameters' dtype.
    """
    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = hf_state_dict(model)
    dtype_name = jnp.dtype(model.param_dtype).name
    if config is None or isinstance(config, LMConfig):
        hf = (config or model.config).to_hf_config(dtype=dtype_name)
    else:
        hf = {**config, "dtype": dtype_name}
        hf.pop("torch_dtype", None)
    save_file(tensors, str(out / SINGLE_FILE), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    return out
