"""OpenVLA (Prismatic): fused DINOv2 + SigLIP patch features, an MLP projector, a Llama LM.

The image goes through each vision tower up to its *second-to-last* block (OpenVLA reads
``get_intermediate_layers(n={depth - 2})``: no final norm, no pooling); the towers' patch
features are concatenated along channels, projected into the LM's embedding space by
``fc1 -> GELU -> fc2 -> GELU -> fc3`` (exact GELU; a single tower uses ``fc1 -> GELU ->
fc2``), and placed right after the BOS token. The towers here are built only up to the
block whose output is read, so the weights OpenVLA never uses are not even allocated.

Pixels are ``[B, H, W, 3 * towers]`` (channels last), each tower taking its own three
channels, normalised as that tower expects (OpenVLA's processor stacks the DINOv2- and the
SigLIP-normalised copies of the image). Prompts are token ids ``[B, T]`` with a mask and may
be left-padded: the patches go after each row's first real token (its BOS), and positions
count real tokens only, so a padded row computes what it computes alone.

Policy functions (pure in the model, jit them with ``nnx.jit``):
- ``forward_actions``: teacher-forced log-probs (and entropies) of given action tokens after
  the prompt, restricted to the action ids, plus the hidden state before the first action
  token (the value head's input);
- ``generate_actions``: greedy or sampled action tokens on a KV cache, one token per action
  dimension, each drawn among the action ids only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.layers import Dense
from rlinf_jax.policies.lm.model import CausalLM
from rlinf_jax.policies.vla import action_tokens as at
from rlinf_jax.policies.vla.vit import ViT, ViTConfig

# timm architectures OpenVLA checkpoints name (``timm_model_ids``), as timm builds them:
# DINOv2 with registers gives its CLS token no position embedding (no_embed_class); timm's
# SigLIP so400m uses the *exact* GELU (nn.GELU, timm's default), not SigLIP's tanh form,
# and OpenVLA does not override it.
TIMM_MODELS: Mapping[str, dict] = {
    "vit_large_patch14_reg4_dinov2": {
        "embed_dim": 1024, "depth": 24, "num_heads": 16, "mlp_ratio": 4.0, "patch_size": 14,
        "reg_tokens": 4, "no_embed_class": True, "init_values": 1e-5,
    },
    "vit_large_patch14_dinov2": {
        "embed_dim": 1024, "depth": 24, "num_heads": 16, "mlp_ratio": 4.0, "patch_size": 14, "init_values": 1e-5,
    },
    "vit_so400m_patch14_siglip_224": {
        "embed_dim": 1152, "depth": 27, "num_heads": 16, "mlp_ratio": 3.7362, "patch_size": 14, "class_token": False,
    },
    "vit_so400m_patch14_siglip_384": {
        "embed_dim": 1152, "depth": 27, "num_heads": 16, "mlp_ratio": 3.7362, "patch_size": 14, "class_token": False,
    },
}  # fmt: skip
_ACT = {None: False, "gelu": False, "gelu_tanh": True, "gelu_pytorch_tanh": True}


def timm_vit_config(spec: Mapping, image_size: int, act_layer: str | None = None) -> tuple[ViTConfig, int]:
    """(the ViT config of a featurizer, the timm model's full depth) for a timm ``spec``
    (``TIMM_MODELS`` fields). The config keeps the blocks up to the second-to-last one."""
    act = act_layer if act_layer is not None else spec.get("act_layer")
    if act not in _ACT:
        raise BadInput(f"vision act_layer {act!r} is not supported; use one of {', '.join(str(a) for a in _ACT)}")
    class_token, regs = (
        bool(spec.get("class_token", True)),
        int(spec.get("reg_tokens", 0)),
    )
    no_embed_class = bool(spec.get("no_embed_class", False))
    if regs and not no_embed_class:
        raise BadInput("timm ViTs with register tokens and no_embed_class=false are not supported")
    depth, dim = int(spec["depth"]), int(spec["embed_dim"])
    if depth < 2:
        raise BadInput(f"a featurizer needs at least 2 blocks (OpenVLA reads the second-to-last); got depth={depth}")
    config = ViTConfig(
        model_type="timm_vit",
        hidden_size=dim,
        intermediate_size=int(dim * float(spec.get("mlp_ratio", 4.0))),
        num_layers=depth - 1,
        num_heads=int(spec["num_heads"]),
        image_size=int(image_size),
        patch_size=int(spec["patch_size"]),
        layer_norm_eps=1e-6,
        gelu_approximate=_ACT[act],
        class_token=class_token,
        num_register_tokens=regs,
        pos_embed_prefix=int(class_token and not no_embed_class),
        layer_scale=spec.get("init_values") is not None,
        layer_scale_init=float(spec.get("init_values") or 1.0),
        qkv_bias=bool(spec.get("qkv_bias", True)),
        final_norm=False,
        attention_pool=False,
    )
    return config, depth


@dataclasses.dataclass(frozen=True)
class OpenVLAConfig:
    vision: tuple[ViTConfig, ...]  # featurizers, each built up to its feature block
    vision_depths: tuple[int, ...]  # the timm models' full depths (the checkpoint's blocks)
    text: LMConfig
    n_action_bins: int = 256
    action_vocab_end: int = 32000  # the tokenizer's vocabulary size
    norm_stats_json: str = "{}"  # per-dataset action statistics, as the checkpoint holds them

    def __post_init__(self):
        if not 1 <= len(self.vision) <= 2:
            raise BadInput(f"OpenVLA takes one or two vision towers; got {len(self.vision)}")
        if len({(c.image_size, c.num_patches) for c in self.vision}) != 1:
            raise BadInput("the fused vision towers must share the image size and patch grid")
        if self.action_vocab_end > self.text.vocab_size:
            raise BadInput(
                f"action ids end at {self.action_vocab_end}, past the LM vocabulary of {self.text.vocab_size}"
            )

    @property
    def fused(self) -> bool:
        return len(self.vision) == 2

    @property
    def vision_dim(self) -> int:
        return sum(c.hidden_size for c in self.vision)

    @property
    def num_patches(self) -> int:
        return self.vision[0].num_patches

    @property
    def image_size(self) -> int:
        return self.vision[0].image_size

    @property
    def norm_stats(self) -> dict:
        return json.loads(self.norm_stats_json)

    @property
    def tokenizer(self) -> at.ActionTokenizer:
        return at.ActionTokenizer(self.action_vocab_end, self.n_action_bins)

    def action_stats(self, dataset: str | None = None) -> at.ActionStats:
        return at.ActionStats.from_norm_stats(self.norm_stats, dataset)

    @classmethod
    def from_hf_config(cls, hf: dict) -> OpenVLAConfig:
        """Read OpenVLA's ``config.json`` (``OpenVLAConfig`` / ``PrismaticConfig``).

        The towers come from ``timm_model_ids`` via ``TIMM_MODELS``; a config may describe
        other timm ViTs in a ``timm_model_configs`` dict (id -> ``TIMM_MODELS``-style fields).
        """
        if hf.get("model_type") not in ("openvla", "prismatic"):
            raise BadInput(f"config.json model_type={hf.get('model_type')!r} is not an OpenVLA / Prismatic model")
        for key in ("text_config", "timm_model_ids", "image_sizes"):
            if key not in hf:
                raise BadInput(f"config.json lacks {key!r}, which an OpenVLA model needs")
        ids = list(hf["timm_model_ids"])
        fused = bool(hf.get("use_fused_vision_backbone", len(ids) == 2))
        if fused != (len(ids) == 2):
            raise BadInput(f"use_fused_vision_backbone={fused} but timm_model_ids names {len(ids)} model(s)")
        sizes, acts = (
            list(hf["image_sizes"]),
            list(hf.get("timm_override_act_layers") or [None] * len(ids)),
        )
        extra = hf.get("timm_model_configs") or {}
        vision, depths = [], []
        for i, name in enumerate(ids):
            spec = extra.get(name) or TIMM_MODELS.get(name) or TIMM_MODELS.get(name.split(".")[0])
            if spec is None:
                raise BadInput(
                    f"timm model {name!r} is unknown; known: {', '.join(TIMM_MODELS)} "
                    "(or describe it in config.json timm_model_configs)"
                )
            config, depth = timm_vit_config(spec, sizes[i], acts[i] if i < len(acts) else None)
            vision.append(config)
            depths.append(depth)
        text = LMConfig.from_hf_config(hf["text_config"])
        pad = int(hf.get("pad_to_multiple_of", 0) or 0)
        return cls(
            vision=tuple(vision),
            vision_depths=tuple(depths),
            text=text,
            n_action_bins=int(hf.get("n_action_bins", 256)),
            # As OpenVLA: the embedding table was padded by `pad_to_multiple_of` rows.
            action_vocab_end=text.vocab_size - pad,
            norm_stats_json=json.dumps(hf.get("norm_stats") or {}, sort_keys=True),
        )


class Projector(nnx.Module):
    """Prismatic's MLP projector: fused towers ``fc1 (4x) -> GELU -> fc2 -> GELU -> fc3``,
    a single tower ``fc1 -> GELU -> fc2`` (exact GELU)."""

    def __init__(self, vision_dim: int, llm_dim: int, fused: bool, *, dtype, param_dtype, rngs):
        kw = {
            "use_bias": True,
            "dtype": dtype,
            "param_dtype": param_dtype,
            "rngs": rngs,
        }
        if fused:
            self.fc1 = Dense(vision_dim, 4 * vision_dim, (None, "mlp"), **kw)
            self.fc2 = Dense(4 * vision_dim, llm_dim, ("mlp", "embed"), **kw)
            self.fc3 = Dense(llm_dim, llm_dim, (None, "embed"), **kw)
        else:
            self.fc1 = Dense(vision_dim, llm_dim, (None, "embed"), **kw)
            self.fc2 = Dense(llm_dim, llm_dim, (None, "embed"), **kw)
            self.fc3 = None

    def __call__(self, x: jax.Array) -> jax.Array:
        lead = x.shape[:-1]
        h = x.reshape(-1, x.shape[-1])
        h = self.fc2(jax.nn.gelu(self.fc1(h), approximate=False))
        if self.fc3 is not None:
            h = self.fc3(jax.nn.gelu(h, approximate=False))
        return h.reshape(*lead, -1)


class OpenVLA(nnx.Module):
    def __init__(
        self,
        config: OpenVLAConfig,
        *,
        dtype=jnp.float32,
        param_dtype=None,
        rngs: nnx.Rngs,
        scan_layers: bool = False,
        remat: str = "none",
    ):
        param_dtype = param_dtype or dtype
        self.config = config
        self.dtype = dtype
        self.param_dtype = param_dtype
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        # ``scan_layers`` / ``remat``: the towers' and the LM's blocks under lax.scan and
        # a rematerialisation policy (see `CausalLM`).
        layout = {"scan_layers": scan_layers, "remat": remat}
        self.featurizers = nnx.List([ViT(c, **layout, **kw) for c in config.vision])
        self.projector = Projector(config.vision_dim, config.text.hidden_size, config.fused, **kw)
        self.llm = CausalLM(config.text, **layout, **kw)

    def image_features(self, pixels: jax.Array) -> jax.Array:
        """Concatenated patch features ``[B, num_patches, vision_dim]``."""
        n = len(self.featurizers)
        if pixels.ndim != 4 or pixels.shape[-1] != 3 * n:
            raise BadInput(f"pixels have shape {tuple(pixels.shape)}; OpenVLA takes [batch, H, W, {3 * n}]")
        feats = [vit.patch_features(pixels[..., 3 * i : 3 * i + 3], layer=-1) for i, vit in enumerate(self.featurizers)]
        return jnp.concatenate(feats, axis=-1)

    def image_embeddings(self, pixels: jax.Array) -> jax.Array:
        """Projected patches ``[B, num_patches, llm_dim]`` (OpenVLA's ``projector_features``)."""
        return self.projector(self.image_features(pixels))

    def multimodal_inputs(self, input_ids, attention_mask, pixels=None, *, patches=None):
        """``(inputs_embeds [B, T + N, d], mask [B, T + N])``: each row's tokens with the N
        projected patches after its first real token. Pass ``patches`` (from
        ``image_embeddings``) to reuse them."""
        B, T = input_ids.shape
        mask = jnp.ones((B, T), bool) if attention_mask is None else attention_mask.astype(bool)
        if patches is None:
            patches = self.image_embeddings(pixels)
        N = patches.shape[1]
        tokens = self.llm.embed(input_ids.reshape(-1)).reshape(B, T, -1)
        bos = jnp.argmax(mask, axis=1)[:, None]  # first real token (0 for an unpadded row)
        j = jnp.arange(T + N)[None, :]
        is_patch = (j > bos) & (j <= bos + N)
        token_at = jnp.clip(jnp.where(j <= bos, j, j - N), 0, T - 1)
        patch_at = jnp.clip(j - bos - 1, 0, N - 1)
        tok = jnp.take_along_axis(tokens, token_at[..., None], axis=1)
        img = jnp.take_along_axis(patches.astype(tokens.dtype), patch_at[..., None], axis=1)
        embeds = jnp.where(is_patch[..., None], img, tok)
        full_mask = is_patch | jnp.take_along_axis(mask, token_at, axis=1)
        return embeds, full_mask

    def hidden_states(self, input_ids, attention_mask, pixels=None, *, patches=None) -> jax.Array:
        embeds, mask = self.multimodal_inputs(input_ids, attention_mask, pixels, patches=patches)
        return self.llm.hidden_states(attention_mask=mask, inputs_embeds=embeds)

    def __call__(self, input_ids, attention_mask, pixels=None, *, patches=None) -> jax.Array:
        """Float32 logits ``[B, T + N, V]`` over the multimodal sequence."""
        return self.llm.logits(self.hidden_states(input_ids, attention_mask, pixels, patches=patches))


class ActionForward(NamedTuple):
    token_logprobs: jax.Array  # [B, A] log p(action token) among the action ids
    entropy: jax.Array  # [B, A] entropy of that restricted distribution
    value_hidden: jax.Array  # [B, d] hidden state at the last prompt token (before the first action)


def forward_actions(model: OpenVLA, input_ids, attention_mask, pixels, action_ids, temperature=1.0) -> ActionForward:
    """Teacher-forced pass over ``[prompt, action_ids[:, :-1]]``: the log-prob of each action
    token given the (left-padded) prompt and the tokens before it."""
    B, T = input_ids.shape
    A = action_ids.shape[1]
    mask = jnp.ones((B, T), bool) if attention_mask is None else attention_mask.astype(bool)
    ids = jnp.concatenate([input_ids, action_ids[:, :-1]], axis=1).astype(jnp.int32)
    full = jnp.concatenate([mask, jnp.ones((B, A - 1), bool)], axis=1)
    hidden = model.hidden_states(ids, full, pixels)
    start = hidden.shape[1] - A  # position of the last prompt token
    h = hidden[:, start:]
    logits = model.llm.logits(h)
    tok = model.config.tokenizer
    return ActionForward(
        at.token_logprobs(tok, logits, action_ids, temperature),
        at.token_entropy(tok, logits, temperature),
        hidden[:, start],
    )


def action_logprobs(
    model: OpenVLA,
    input_ids,
    attention_mask,
    pixels,
    action_ids,
    *,
    action_dim: int,
    level: str = "token",
    temperature=1.0,
) -> jax.Array:
    """RL log-probs of ``action_ids [B, A]`` at ``level`` (token / action / chunk)."""
    out = forward_actions(model, input_ids, attention_mask, pixels, action_ids, temperature)
    return at.reduce_logprobs(out.token_logprobs, action_dim, level)


class Generated(NamedTuple):
    action_ids: jax.Array  # [B, A]
    logprobs: jax.Array  # [B, A] under the temperature-scaled restricted distribution
    value_hidden: jax.Array  # [B, d]


def generate_actions(
    model: OpenVLA,
    input_ids,
    attention_mask,
    pixels,
    key,
    num_tokens: int,
    temperature=0.0,
) -> Generated:
    """``num_tokens`` action tokens after the prompt (greedy if ``temperature <= 0``), on a
    KV cache: one prefill over the multimodal prompt, then one cached step per token (a
    ``lax.scan``, so the step compiles once)."""
    tok = model.config.tokenizer
    embeds, mask = model.multimodal_inputs(input_ids, attention_mask, pixels)
    B, P, _ = embeds.shape
    full = jnp.concatenate([mask, jnp.ones((B, num_tokens), bool)], axis=1)
    cache = model.llm.init_cache(B, P + num_tokens)
    hidden, cache = model.llm.hidden_states(attention_mask=full, cache=cache, cache_index=0, inputs_embeds=embeds)
    value_hidden = hidden[:, -1]
    keys = jax.random.split(key, num_tokens)
    first, first_lp = at.choose(tok, model.llm.logits(value_hidden), keys[0], temperature)

    def step(carry, xs):
        cache, token = carry
        i, k = xs
        emb = model.llm.embed(token)[:, None]
        out, cache = model.llm.hidden_states(attention_mask=full, cache=cache, cache_index=P + i, inputs_embeds=emb)
        token, lp = at.choose(tok, model.llm.logits(out[:, 0]), k, temperature)
        return (cache, token), (token, lp)

    _, (rest, rest_lp) = jax.lax.scan(step, (cache, first), (jnp.arange(num_tokens - 1), keys[1:]))
    ids = jnp.concatenate([first[:, None], rest.T], axis=1)
    lps = jnp.concatenate([first_lp[:, None], rest_lp.T], axis=1)
    return Generated(ids, lps, value_hidden)


def decode_actions(config: OpenVLAConfig, action_ids, dataset: str | None = None) -> jax.Array:
    """Action ids ``[B, action_dim]`` -> robot actions: bin centres, un-normalised with the
    dataset's q01/q99."""
    return config.action_stats(dataset).unnormalize(config.tokenizer.decode(action_ids))


def predict_action(
    model: OpenVLA,
    input_ids,
    attention_mask,
    pixels,
    key=None,
    *,
    dataset=None,
    temperature=0.0,
):
    """Robot actions ``[B, action_dim]``: decode one token per dimension, map ids to bin
    centres and un-normalise with the dataset's q01/q99 (OpenVLA's ``predict_action``)."""
    stats = model.config.action_stats(dataset)
    key = jax.random.key(0) if key is None else key
    out = generate_actions(model, input_ids, attention_mask, pixels, key, stats.action_dim, temperature)
    return stats.unnormalize(model.config.tokenizer.decode(out.action_ids))
