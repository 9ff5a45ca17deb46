"""GR00T-N1.5 checkpoints (``GR00TN15``, as the hub's ``nvidia/GR00T-N1.5-3B`` and
Isaac-GR00T's fine-tunes hold them, or a lerobot ``GrootPolicy``'s ``_groot_model.``) ->
``policies.vla.gr00t.Gr00t``.

The config.json is GR00T's (``model_type: gr00t_n1_5``; `Gr00tConfig.from_config`). The
Eagle backbone's own config is not in it: the published model takes it from the hub's
processor repository, whose sizes are `PUBLISHED_EAGLE`; a small checkpoint names its own in
``backbone_cfg.eagle_config``.

Weights: ``backbone.eagle_model.vision_model.vision_model.*`` (SigLIP, its unused pooling
head included), ``backbone.eagle_model.mlp1.*`` (the connector), the Qwen3 LM under
``backbone.eagle_model.language_model.model.*`` (layers past ``select_layer`` skipped by name:
GR00T never runs them), ``backbone.eagle_linear.*`` when projected, and ``action_head.*``:
``vlln``, ``vl_self_attention`` and ``model`` (the DiT: diffusers' ``transformer_blocks``,
``timestep_encoder``, ``proj_out_*``), the per-embodiment ``state_encoder`` /
``action_encoder`` / ``action_decoder``, ``future_tokens``, ``position_embedding``. The LM's
output head is never used: skipped when the token table is there, else (tied, saved once)
it fills the table. Everything else must fill a parameter and every parameter must be
filled; the RL heads start fresh, as pi0's do.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax.numpy as jnp
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.convert import keys, store
from rlinf_jax.policies.convert.keys import Row, Skip
from rlinf_jax.policies.convert.pi0 import GEMMA_ROWS, RL_HEADS, RL_HEADS_KEY, convert_flow_model, load_flow_model
from rlinf_jax.policies.convert.vision import SIGLIP_ROWS
from rlinf_jax.policies.lm.hf_checkpoint import read_hf_config
from rlinf_jax.policies.lm.published import PUBLISHED_EAGLE
from rlinf_jax.policies.vla.gr00t import Gr00t, Gr00tConfig

_ROOTS = ("", "_groot_model.")  # GR00TN15's own keys, or a lerobot GrootPolicy's


def _linear(src: str, ours: str) -> tuple[Row, ...]:
    return Row(f"{src}.weight", f"{ours}.kernel", "T"), Row(f"{src}.bias", f"{ours}.bias")


def _norm(src: str, ours: str) -> tuple[Row, ...]:
    return Row(f"{src}.weight", f"{ours}.scale"), Row(f"{src}.bias", f"{ours}.bias")


def _blocks(src: str, ours: str) -> tuple[Row, ...]:
    """diffusers ``BasicTransformerBlock`` rows (`policies.vla.dit.Block`)."""
    b, o = src + ".transformer_blocks.{layer}", ours + ".blocks.{layer}"
    return (
        *_linear(f"{b}.norm1.linear", f"{o}.ada"),
        *_norm(f"{b}.norm1", f"{o}.norm1"),
        *_norm(f"{b}.norm3", f"{o}.norm3"),
        Row(f"{b}.attn1.to_{{proj}}.weight", f"{o}.attn.to_{{proj}}.kernel", "T"),
        Row(f"{b}.attn1.to_{{proj}}.bias", f"{o}.attn.to_{{proj}}.bias"),
        *_linear(f"{b}.attn1.to_out.0", f"{o}.attn.to_out"),
        *_linear(f"{b}.ff.net.0.proj", f"{o}.ff.proj"),
        *_linear(f"{b}.ff.net.2", f"{o}.ff.out"),
    )


def _category(src: str, ours: str, names: tuple[str, ...]) -> tuple[Row, ...]:
    return tuple(Row(f"{src}.{n}.{p}", f"{ours}.{n}.{p}") for n in names for p in ("W", "b"))


HEAD_ROWS = (
    *_norm("vlln", "vlln"),
    *_blocks("vl_self_attention", "vl_self_attention"),
    *_blocks("model", "dit"),
    *_linear("model.timestep_encoder.timestep_embedder.linear_1", "dit.time_1"),
    *_linear("model.timestep_encoder.timestep_embedder.linear_2", "dit.time_2"),
    *_linear("model.proj_out_1", "dit.proj_out_1"),
    *_linear("model.proj_out_2", "dit.proj_out_2"),
    *_category("state_encoder", "state_encoder", ("layer1", "layer2")),
    *_category("action_decoder", "action_decoder", ("layer1", "layer2")),
    *_category("action_encoder", "action_encoder", ("W1", "W2", "W3")),
    Row("future_tokens.weight", "future_tokens"),
    Row("position_embedding.weight", "position_embedding"),
)


def gr00t_rows(source_keys, config: Gr00tConfig) -> tuple[tuple[Row, ...], tuple[Skip, ...]]:
    """(rows, skips) for a GR00T-N1.5 checkpoint (module docstring)."""
    rows, skips = [], []
    two_layer = config.eagle.mlp_connector_layers == 2
    connector = ((*_norm("mlp1.0", "connector_norm"), *_linear("mlp1.1", "connector_1"),
                  *_linear("mlp1.3", "connector_2")) if two_layer else _linear("mlp1.0", "connector_1"))
    for root in _ROOTS:
        eagle = root + "backbone.eagle_model."
        rows += keys.prefixed(eagle + "vision_model.", SIGLIP_ROWS, "vision_tower.")
        rows += keys.prefixed(eagle, connector)
        rows += keys.prefixed(eagle + "language_model.model.", GEMMA_ROWS, "language_model.")
        rows += _linear(root + "backbone.eagle_linear", "eagle_linear")
        rows += keys.prefixed(root + "action_head.", HEAD_ROWS)
        lm = eagle + "language_model."
        if any(k == lm + "model.embed_tokens.weight" for k in source_keys):
            skips.append(Skip(re.escape(lm + "lm_head.weight"), "the LM's output head: GR00T reads hidden states only"))
        else:
            rows.append(Row(lm + "lm_head.weight", "language_model.embed.embedding"))
    kept = config.eagle.text.num_layers
    past = re.compile(r"(_groot_model\.)?backbone\.eagle_model\.language_model\.model\.layers\.(\d+)\..*")
    for key in source_keys:
        m = past.fullmatch(key)
        if m and int(m.group(2)) >= kept:
            skips.append(Skip(re.escape(key), f"LM layers past select_layer={kept}: GR00T never runs them"))
    return tuple(rows), tuple(skips)


def eagle_config_of(hf: dict) -> dict:
    """The Eagle backbone's config: ``backbone_cfg.eagle_config`` when the checkpoint names
    one, else the published N1.5 backbone's (`PUBLISHED_EAGLE`)."""
    backbone = hf.get("backbone_cfg") or {}
    return backbone.get("eagle_config") or PUBLISHED_EAGLE


def gr00t_config(hf: dict, **rl) -> Gr00tConfig:
    """The ``Gr00tConfig`` of a config.json, with the RL heads it records (or ``rl``)."""
    if hf.get("model_type") not in ("gr00t_n1_5", "gr00t_n1"):
        raise BadInput(f"config.json model_type={hf.get('model_type')!r} is not GR00T-N1.5's 'gr00t_n1_5'")
    recorded = {k: tuple(v) for k, v in hf.get(RL_HEADS_KEY, {}).items()}
    return Gr00tConfig.from_config(hf, eagle_config_of(hf), **{**recorded, **rl})


def from_pretrained(path, dtype=jnp.float32, param_dtype=None, **rl) -> Gr00t:
    """A ``Gr00t`` from a local GR00T-N1.5 directory; ``rl`` adds fresh RL heads
    (``value_hidden``, ``noise_hidden``, ``noise_std_range``)."""
    config = gr00t_config(read_hf_config(path), **rl)
    return load_flow_model(
        lambda d, pd, rngs: Gr00t(config, dtype=d, param_dtype=pd, rngs=rngs),
        path,
        lambda source: gr00t_rows(source, config),
        "GR00T-N1.5",
        dtype,
        param_dtype or dtype,
        fresh=RL_HEADS,
    )


def convert(src, out_dir, dtype="auto", **rl) -> Path:
    """GR00T-N1.5 directory ``src`` -> converted directory ``out_dir``; ``"auto"`` reads the
    config's ``compute_dtype`` (float32 unless it names bfloat16)."""
    hf = read_hf_config(src)
    if dtype in (None, "auto"):
        dtype = "bfloat16" if hf.get("compute_dtype") == "bfloat16" else "float32"
    return convert_flow_model(from_pretrained, src, out_dir, dtype, **rl)


def load(path, dtype=None) -> Gr00t:
    """The ``Gr00t`` written by ``convert`` (RL heads as its config.json records)."""

    def build(hf, d, pd):
        return Gr00t(gr00t_config(hf), dtype=d, param_dtype=pd, rngs=nnx.Rngs(0))

    return store.load_converted(path, build, dtype)


__all__ = ["convert", "eagle_config_of", "from_pretrained", "gr00t_config", "gr00t_rows", "load"]
