"""OpenVLA in Flax against a torch OpenVLA assembled from transformers models.

The stand-in checkpoint has OpenVLA's layout and key names (timm towers under
``vision_backbone.featurizer.`` / ``fused_featurizer.`` with fused ``attn.qkv``,
``ls1/ls2.scale_factor``, ``pos_embed`` without a CLS row, plus ``projector.fc1..3`` and
``language_model.*``), the weights OpenVLA never uses included (last blocks, final norms,
SigLIP's attention pool). The torch reference runs the same weights through transformers'
``Dinov2WithRegistersModel`` (CLS position row zeroed: timm's DINOv2 gives the CLS token no
position embedding), ``SiglipVisionModel`` (exact GELU, as timm's so400m SigLIP), a torch
projector and ``LlamaForCausalLM``, following OpenVLA's forward: second-to-last block patch
features, concatenated, projected, inserted after BOS. Awkward tiny sizes: 28 px images,
patch 14, DINOv2 hidden 48 / SigLIP hidden 36 with 3 heads each, 3 register tokens, Llama
with 1 KV head and a vocabulary of 304 whose last 4 rows are padding and the 16 before them
are the action bins. Every parameter is random. fp32, max |diff| <= 1e-4.

When timm (and a torchvision that loads) is installed, the towers are also checked against
timm's own ``get_intermediate_layers`` on the same state dicts.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import nnx
from safetensors.numpy import load_file, save_file

from rlinf_jax.errors import BadInput
from rlinf_jax.policies import convert as registry
from rlinf_jax.policies.convert import openvla as convert_openvla
from rlinf_jax.policies.lm.tiny import tiny_hf_model
from rlinf_jax.policies.vla import action_tokens as at
from rlinf_jax.policies.vla import openvla as ov

torch.set_num_threads(1)
TOL = 1e-4
IMAGE, PATCH, DEPTH, REGS = 28, 14, 3, 3
VOCAB, PAD_ROWS, BINS = 304, 4, 16
VOCAB_END = VOCAB - PAD_ROWS  # 300: action ids 284..299
ACTION_DIM = 7
Q01 = [-0.5, -0.4, -0.3, -0.2, -0.1, -1.0, 0.0]
Q99 = [0.5, 0.6, 0.7, 0.2, 0.9, 1.0, 1.0]
MASK = [True] * 6 + [False]


def randomise(model, seed, scale=0.3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32) * scale
            is_norm = "norm" in name and name.endswith("weight")
            p.copy_(noise + (1.0 if is_norm else 0.0))
    return model.eval()


class TorchOpenVLA:
    """OpenVLA's forward on transformers / torch modules."""

    def __init__(self, seed=0):
        dcfg = transformers.Dinov2WithRegistersConfig(
            hidden_size=48, mlp_ratio=3, num_hidden_layers=DEPTH, num_attention_heads=3,
            image_size=IMAGE, patch_size=PATCH, num_register_tokens=REGS,
        )  # fmt: skip
        scfg = transformers.SiglipVisionConfig(
            hidden_size=36, intermediate_size=90, num_hidden_layers=DEPTH, num_attention_heads=3,
            image_size=IMAGE, patch_size=PATCH, hidden_act="gelu", vision_use_head=True,
        )  # fmt: skip
        for c in (dcfg, scfg):
            c._attn_implementation = "eager"
        self.dino = randomise(transformers.Dinov2WithRegistersModel(dcfg), seed + 1)
        with torch.no_grad():
            self.dino.embeddings.position_embeddings[:, 0] = 0.0
        self.siglip = randomise(transformers.SiglipVisionModel(scfg), seed + 2)
        torch.manual_seed(seed + 3)
        vision_dim, llm_dim = 48 + 36, 60
        self.projector = torch.nn.ModuleDict(
            {
                "fc1": torch.nn.Linear(vision_dim, 4 * vision_dim),
                "fc2": torch.nn.Linear(4 * vision_dim, llm_dim),
                "fc3": torch.nn.Linear(llm_dim, llm_dim),
            }
        )
        randomise(self.projector, seed + 4)
        with (
            torch.no_grad()
        ):  # keep activations O(1) so that 1e-4 is an fp32-sized tolerance
            for layer in self.projector.values():
                layer.weight.mul_(layer.in_features**-0.5 / 0.3)
        self.llm = tiny_hf_model(
            "llama", seed=seed + 5, vocab_size=VOCAB, num_key_value_heads=1
        )

    def projected(self, pixels):
        """pixels ``[B, 6, H, W]`` -> projected patches ``[B, N, llm_dim]``."""
        with torch.no_grad():
            d = self.dino(
                pixel_values=pixels[:, :3], output_hidden_states=True
            ).hidden_states[DEPTH - 1]
            s = self.siglip(
                pixel_values=pixels[:, 3:], output_hidden_states=True
            ).hidden_states[DEPTH - 1]
            x = torch.cat([d[:, 1 + REGS :], s], dim=-1)
            p = self.projector
            return p["fc3"](
                torch.nn.functional.gelu(
                    p["fc2"](torch.nn.functional.gelu(p["fc1"](x)))
                )
            )

    def logits(self, pixels, ids):
        """One unpadded row: pixels ``[1, 6, H, W]``, ids ``[1, T]`` -> ``[1, T + N, V]``."""
        with torch.no_grad():
            emb = self.llm.get_input_embeddings()(ids)
            mm = torch.cat([emb[:, :1], self.projected(pixels), emb[:, 1:]], dim=1)
            return self.llm(inputs_embeds=mm).logits

    def checkpoint(self) -> dict[str, np.ndarray]:
        """The weights under OpenVLA's checkpoint keys (timm layout)."""
        out = {}
        sd = {k: v.numpy() for k, v in self.dino.state_dict().items()}
        f = "vision_backbone.featurizer."
        e = "embeddings."
        out[f + "patch_embed.proj.weight"] = sd[
            e + "patch_embeddings.projection.weight"
        ]
        out[f + "patch_embed.proj.bias"] = sd[e + "patch_embeddings.projection.bias"]
        out[f + "pos_embed"] = sd[e + "position_embeddings"][:, 1:]
        out[f + "cls_token"] = sd[e + "cls_token"]
        out[f + "reg_token"] = sd[e + "register_tokens"]
        for i in range(DEPTH):
            s, t = f"encoder.layer.{i}.", f"{f}blocks.{i}."
            qkv = [sd[f"{s}attention.{p}_proj.weight"] for p in "qkv"]
            out[t + "attn.qkv.weight"] = np.concatenate(qkv)
            out[t + "attn.qkv.bias"] = np.concatenate(
                [sd[f"{s}attention.{p}_proj.bias"] for p in "qkv"]
            )
            out[t + "attn.proj.weight"] = sd[s + "attention.o_proj.weight"]
            out[t + "attn.proj.bias"] = sd[s + "attention.o_proj.bias"]
            out[t + "ls1.scale_factor"] = sd[s + "layer_scale1.lambda1"]
            out[t + "ls2.scale_factor"] = sd[s + "layer_scale2.lambda1"]
            for n in ("norm1", "norm2", "mlp.fc1", "mlp.fc2"):
                out[t + n + ".weight"], out[t + n + ".bias"] = (
                    sd[s + n + ".weight"],
                    sd[s + n + ".bias"],
                )
        out[f + "norm.weight"], out[f + "norm.bias"] = (
            sd["layernorm.weight"],
            sd["layernorm.bias"],
        )

        sd = {k: v.numpy() for k, v in self.siglip.state_dict().items()}
        f = "vision_backbone.fused_featurizer."
        out[f + "patch_embed.proj.weight"] = sd[e + "patch_embedding.weight"]
        out[f + "patch_embed.proj.bias"] = sd[e + "patch_embedding.bias"]
        out[f + "pos_embed"] = sd[e + "position_embedding.weight"][None]
        for i in range(DEPTH):
            s, t = f"encoder.layers.{i}.", f"{f}blocks.{i}."
            out[t + "attn.qkv.weight"] = np.concatenate(
                [sd[f"{s}self_attn.{p}_proj.weight"] for p in "qkv"]
            )
            out[t + "attn.qkv.bias"] = np.concatenate(
                [sd[f"{s}self_attn.{p}_proj.bias"] for p in "qkv"]
            )
            out[t + "attn.proj.weight"] = sd[s + "self_attn.out_proj.weight"]
            out[t + "attn.proj.bias"] = sd[s + "self_attn.out_proj.bias"]
            for a, b in (
                ("norm1", "layer_norm1"),
                ("norm2", "layer_norm2"),
                ("mlp.fc1", "mlp.fc1"),
                ("mlp.fc2", "mlp.fc2"),
            ):
                out[t + a + ".weight"], out[t + a + ".bias"] = (
                    sd[s + b + ".weight"],
                    sd[s + b + ".bias"],
                )
        out[f + "norm.weight"], out[f + "norm.bias"] = (
            sd["post_layernorm.weight"],
            sd["post_layernorm.bias"],
        )
        D = 36
        out[f + "attn_pool.latent"] = sd["head.probe"]
        out[f + "attn_pool.q.weight"] = sd["head.attention.in_proj_weight"][:D]
        out[f + "attn_pool.q.bias"] = sd["head.attention.in_proj_bias"][:D]
        out[f + "attn_pool.kv.weight"] = sd["head.attention.in_proj_weight"][D:]
        out[f + "attn_pool.kv.bias"] = sd["head.attention.in_proj_bias"][D:]
        for a, b in (
            ("proj", "attention.out_proj"),
            ("norm", "layernorm"),
            ("mlp.fc1", "mlp.fc1"),
            ("mlp.fc2", "mlp.fc2"),
        ):
            out[f"{f}attn_pool.{a}.weight"], out[f"{f}attn_pool.{a}.bias"] = (
                sd[f"head.{b}.weight"],
                sd[f"head.{b}.bias"],
            )

        for k, v in self.projector.state_dict().items():
            out["projector." + k] = v.numpy()
        for k, v in self.llm.state_dict().items():
            out["language_model." + k] = v.numpy()
        return {k: np.ascontiguousarray(v) for k, v in out.items()}

    def config(self) -> dict:
        return {
            "model_type": "openvla",
            "architectures": ["OpenVLAForActionPrediction"],
            "use_fused_vision_backbone": True,
            "timm_model_ids": ["tiny_dinov2_reg", "tiny_siglip"],
            "timm_override_act_layers": [None, None],
            "timm_model_configs": {
                "tiny_dinov2_reg": {
                    "embed_dim": 48,
                    "depth": DEPTH,
                    "num_heads": 3,
                    "mlp_ratio": 3,
                    "patch_size": PATCH,
                    "reg_tokens": REGS,
                    "no_embed_class": True,
                    "init_values": 1e-5,
                },
                "tiny_siglip": {
                    "embed_dim": 36,
                    "depth": DEPTH,
                    "num_heads": 3,
                    "mlp_ratio": 2.5,
                    "patch_size": PATCH,
                    "class_token": False,
                },
            },
            "image_sizes": [IMAGE, IMAGE],
            "text_config": self.llm.config.to_dict(),
            "n_action_bins": BINS,
            "pad_to_multiple_of": PAD_ROWS,
            "norm_stats": {"tiny": {"action": {"q01": Q01, "q99": Q99, "mask": MASK}}},
        }


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    ref = TorchOpenVLA()
    path = tmp_path_factory.mktemp("openvla")
    save_file(
        ref.checkpoint(), str(path / "model.safetensors"), metadata={"format": "pt"}
    )
    (path / "config.json").write_text(json.dumps(ref.config()))
    model = convert_openvla.from_pretrained(path)
    return ref, path, model


# Jitted once per shape and shared by the tests (eager dispatch compiles every op apart).
logits_fn = nnx.jit(lambda m, ids, mask, px: m(ids, mask, px))
embeddings_fn = nnx.jit(lambda m, px: m.image_embeddings(px))
forward_fn = nnx.jit(ov.forward_actions)
generate_fn = nnx.jit(ov.generate_actions, static_argnames="num_tokens")


def images(batch, seed=0):
    return (
        np.random.default_rng(seed)
        .normal(size=(batch, 6, IMAGE, IMAGE))
        .astype(np.float32)
    )


def nhwc(x):
    return jnp.asarray(x.transpose(0, 2, 3, 1))


PADS = (0, 3, 1)
T = 9


def prompts(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, 280, (len(PADS), T))
    ids[:, 0] = 0  # placeholder, overwritten by BOS below
    mask = np.ones((len(PADS), T), np.int64)
    for row, n in enumerate(PADS):
        ids[row, :n], mask[row, :n] = 0, 0
        ids[row, n] = 1  # BOS
    return ids, mask


def test_projector_output_matches(standin):
    ref, _path, model = standin
    x = images(len(PADS))
    ours = np.asarray(embeddings_fn(model, nhwc(x)))
    theirs = ref.projected(torch.tensor(x)).numpy()
    assert ours.shape == (len(PADS), (IMAGE // PATCH) ** 2, 60)
    assert np.abs(ours - theirs).max() <= TOL


def test_logits_on_left_padded_prompts_match(standin):
    ref, _path, model = standin
    ids, mask = prompts()
    x = images(len(PADS), seed=1)
    ours = np.asarray(logits_fn(model, jnp.asarray(ids), jnp.asarray(mask), nhwc(x)))
    N = (IMAGE // PATCH) ** 2
    assert ours.shape == (len(PADS), T + N, VOCAB)
    errs = []
    for row, n in enumerate(PADS):
        theirs = ref.logits(
            torch.tensor(x[row : row + 1]), torch.tensor(ids[row : row + 1, n:])
        )[0].numpy()
        errs.append(np.abs(ours[row, n:] - theirs).max())
    assert max(errs) <= TOL, errs


def restricted_logprobs(logits, ids):
    lo = VOCAB_END - BINS
    sl = torch.log_softmax(torch.tensor(logits[..., lo:VOCAB_END]), dim=-1).numpy()
    return np.take_along_axis(sl, (ids - lo)[..., None], axis=-1)[..., 0]


def test_action_logprobs_on_left_padded_prompts_match(standin):
    ref, _path, model = standin
    ids, mask = prompts(seed=2)
    x = images(len(PADS), seed=3)
    A = 2 * ACTION_DIM  # a chunk of two 7-D actions
    actions = np.random.default_rng(4).integers(
        VOCAB_END - BINS, VOCAB_END, (len(PADS), A)
    )
    out = forward_fn(
        model, jnp.asarray(ids), jnp.asarray(mask), nhwc(x), jnp.asarray(actions), 1.0
    )
    expected = []
    for row, n in enumerate(PADS):
        seq = np.concatenate([ids[row, n:], actions[row, :-1]])[None]
        logits = ref.logits(torch.tensor(x[row : row + 1]), torch.tensor(seq))[
            0
        ].numpy()
        expected.append(restricted_logprobs(logits[-A:], actions[row]))
    expected = np.stack(expected)
    ours = np.asarray(out.token_logprobs)
    assert np.abs(ours - expected).max() <= TOL
    per_action = at.reduce_logprobs(out.token_logprobs, ACTION_DIM, "action")
    np.testing.assert_allclose(
        np.asarray(per_action), expected.reshape(3, 2, 7).sum(-1), atol=TOL
    )
    chunk = at.reduce_logprobs(out.token_logprobs, ACTION_DIM, "chunk")
    np.testing.assert_allclose(np.asarray(chunk), expected.sum(-1), atol=TOL)
    # Entropy of the restricted distribution, from the torch logits.
    assert np.all(np.asarray(out.entropy) > 0) and np.all(
        np.asarray(out.entropy) <= np.log(BINS) + 1e-5
    )


@pytest.mark.slow  # compiles the KV-cache decoder
def test_greedy_actions_match_reference_decoding(standin):
    ref, _path, model = standin
    ids, mask = prompts(seed=5)
    x = images(len(PADS), seed=6)
    out = generate_fn(
        model,
        jnp.asarray(ids),
        jnp.asarray(mask),
        nhwc(x),
        jax.random.key(0),
        ACTION_DIM,
        0.0,
    )
    lo = VOCAB_END - BINS
    for row, n in enumerate(PADS):
        seq = list(ids[row, n:])
        for _ in range(ACTION_DIM):
            logits = ref.logits(torch.tensor(x[row : row + 1]), torch.tensor([seq]))[
                0, -1
            ].numpy()
            seq.append(lo + int(np.argmax(logits[lo:VOCAB_END])))
        np.testing.assert_array_equal(
            np.asarray(out.action_ids[row]), seq[-ACTION_DIM:]
        )
    # The decoder's log-probs are the teacher-forced ones of the tokens it chose.
    tf = forward_fn(
        model, jnp.asarray(ids), jnp.asarray(mask), nhwc(x), out.action_ids, 1.0
    )
    np.testing.assert_allclose(
        np.asarray(out.logprobs), np.asarray(tf.token_logprobs), atol=1e-5
    )
    np.testing.assert_allclose(
        np.asarray(out.value_hidden), np.asarray(tf.value_hidden), atol=1e-5
    )


@pytest.mark.slow
def test_sampled_actions_stay_in_bins_and_report_their_logprobs(standin):
    _ref, _path, model = standin
    ids, mask = prompts(seed=7)
    x = nhwc(images(len(PADS), seed=8))
    out = generate_fn(
        model,
        jnp.asarray(ids),
        jnp.asarray(mask),
        x,
        jax.random.key(1),
        ACTION_DIM,
        1.3,
    )
    a = np.asarray(out.action_ids)
    assert a.min() >= VOCAB_END - BINS and a.max() < VOCAB_END
    tf = forward_fn(model, jnp.asarray(ids), jnp.asarray(mask), x, out.action_ids, 1.3)
    np.testing.assert_allclose(
        np.asarray(out.logprobs), np.asarray(tf.token_logprobs), atol=1e-5
    )


def test_decoded_actions_unnormalise_with_dataset_stats(standin):
    _ref, _path, model = standin
    ids, mask = prompts(seed=9)
    x = nhwc(images(len(PADS), seed=10))
    gen = generate_fn(
        model,
        jnp.asarray(ids),
        jnp.asarray(mask),
        x,
        jax.random.key(0),
        ACTION_DIM,
        0.0,
    )
    actions = np.asarray(ov.decode_actions(model.config, gen.action_ids))
    # OpenVLA's formulas, in numpy.
    bins = np.linspace(-1, 1, BINS)
    centers = (bins[:-1] + bins[1:]) / 2
    d = np.clip(VOCAB_END - np.asarray(gen.action_ids) - 1, 0, len(centers) - 1)
    norm = centers[d]
    lo, hi = np.array(Q01), np.array(Q99)
    expected = np.where(MASK, 0.5 * (norm + 1) * (hi - lo) + lo, norm)
    np.testing.assert_allclose(actions, expected, atol=1e-6)


def test_action_tokenizer_matches_openvla_formulas():
    tok = at.ActionTokenizer(vocab_end=32000, n_bins=256)
    x = np.concatenate([np.linspace(-1.2, 1.2, 1001), [-1.0, 1.0, 0.0]]).astype(
        np.float32
    )
    bins = np.linspace(-1, 1, 256)
    expected = 32000 - np.digitize(np.clip(x, -1, 1), bins)
    ids = np.asarray(tok.encode(jnp.asarray(x)))
    np.testing.assert_array_equal(ids, expected)
    assert ids.min() == 31744 and ids.max() == 31999
    assert (
        ids[np.argmin(x)] == 31999
    )  # reverse order: the most negative action is the last id
    centers = (bins[:-1] + bins[1:]) / 2
    np.testing.assert_allclose(
        np.asarray(tok.decode(jnp.asarray(ids))),
        centers[np.clip(32000 - ids - 1, 0, 254)],
        atol=1e-7,
    )
    stats = at.ActionStats.from_norm_stats(
        {"d": {"action": {"q01": Q01, "q99": Q99, "mask": MASK}}}
    )
    a = np.random.default_rng(0).uniform(-1, 1, (5, 7)).astype(np.float32)
    back = np.asarray(stats.normalize(stats.unnormalize(jnp.asarray(a))))
    np.testing.assert_allclose(back, a, atol=1e-5)
    with pytest.raises(BadInput, match="level"):
        at.reduce_logprobs(jnp.zeros((1, 7)), 7, "step")


def test_conversion_names_leftover_and_missing_keys(standin, tmp_path):
    _ref, path, _model = standin
    tensors = load_file(str(path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    bad = {
        **tensors,
        "vision_backbone.featurizer.blocks.0.attn.extra.weight": np.zeros(
            (2, 2), np.float32
        ),
    }
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        BadInput, match=r"'vision_backbone\.featurizer\.blocks\.0\.attn\.extra\.weight'"
    ):
        convert_openvla.from_pretrained(tmp_path)
    # The second-to-last block is used: without it the checkpoint is incomplete.
    short = {k: v for k, v in tensors.items() if "fused_featurizer.blocks.1." not in k}
    save_file(short, str(tmp_path / "model.safetensors"))
    with pytest.raises(BadInput, match=r"featurizers\.1\.blocks\.1\."):
        convert_openvla.from_pretrained(tmp_path)


def test_registry_convert_and_load_round_trip(standin, tmp_path):
    _ref, path, model = standin
    out = registry.convert(path, tmp_path / "converted")
    loaded = registry.load_converted(out)
    assert isinstance(loaded, ov.OpenVLA)
    assert loaded.config.action_stats().action_dim == ACTION_DIM
    ids, mask = prompts(seed=11)
    x = nhwc(images(len(PADS), seed=12))
    np.testing.assert_array_equal(
        np.asarray(logits_fn(loaded, jnp.asarray(ids), jnp.asarray(mask), x)),
        np.asarray(logits_fn(model, jnp.asarray(ids), jnp.asarray(mask), x)),
    )


def _timm():
    try:
        import timm
    except Exception as e:  # noqa: BLE001 - a broken torchvision raises RuntimeError, not ImportError
        pytest.skip(f"timm unavailable: {e!r}"[:200])
    return timm


def test_reference_towers_match_timm(standin):
    timm = _timm()
    ref, _path, _model = standin
    cfg = ref.config()
    ckpt = ref.checkpoint()
    x = torch.tensor(images(2, seed=13))
    for i, (prefix, name, ours) in enumerate(
        (
            ("vision_backbone.featurizer.", "vit_small_patch14_reg4_dinov2", None),
            (
                "vision_backbone.fused_featurizer.",
                "vit_so400m_patch14_siglip_224",
                None,
            ),
        )
    ):
        spec = cfg["timm_model_configs"][cfg["timm_model_ids"][i]]
        kw = {
            k: spec[k]
            for k in ("embed_dim", "depth", "num_heads", "mlp_ratio", "patch_size")
        }
        kw.update(
            class_token=spec.get("class_token", True),
            reg_tokens=spec.get("reg_tokens", 0),
        )
        kw.update(
            no_embed_class=spec.get("no_embed_class", False),
            init_values=spec.get("init_values"),
        )
        vit = timm.create_model(
            name, pretrained=False, num_classes=0, img_size=IMAGE, **kw
        ).eval()
        sd = {
            k[len(prefix) :].replace("scale_factor", "gamma"): torch.tensor(v)
            for k, v in ckpt.items()
            if k.startswith(prefix)
        }
        vit.load_state_dict(sd, strict=True)
        with torch.no_grad():
            feats = vit.get_intermediate_layers(x[:, 3 * i : 3 * i + 3], n={DEPTH - 2})[
                0
            ]
            hf = (ref.dino if i == 0 else ref.siglip)(
                pixel_values=x[:, 3 * i : 3 * i + 3], output_hidden_states=True
            )
            want = hf.hidden_states[DEPTH - 1][:, (1 + REGS) if i == 0 else 0 :]
        assert (feats - want).abs().max() <= TOL, (name, ours)
