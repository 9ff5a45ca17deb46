"""OpenVLA in Flax against a torch OpenVLA assembled from transformers models
(``tests/openvla_torch.py``: the stand-in checkpoint in OpenVLA's layout and its reference).

Checked in fp32 to 1e-4: the projector output, logits on left-padded prompts (each row
against the unpadded row alone in torch), action log-probs restricted to the action ids at
token / action / chunk level, greedy decoding; conversion errors name the leftover or
missing key. When timm (and a torchvision that loads) is installed, the reference towers
are also checked against timm's own ``get_intermediate_layers`` on the same weights.
"""

from __future__ import annotations

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
from rlinf_jax.policies.vla import action_tokens as at
from rlinf_jax.policies.vla import openvla as ov
from tests.openvla_torch import (
    ACTION_DIM,
    BINS,
    DEPTH,
    IMAGE,
    MASK,
    PATCH,
    Q01,
    Q99,
    REGS,
    VOCAB,
    VOCAB_END,
    write_standin,
)

torch.set_num_threads(1)
TOL = 1e-4


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    path = tmp_path_factory.mktemp("openvla")
    ref = write_standin(path)
    model = convert_openvla.from_pretrained(path)
    return ref, path, model


# Jitted once per shape and shared by the tests (eager dispatch compiles every op apart).
logits_fn = nnx.jit(lambda m, ids, mask, px: m(ids, mask, px))
embeddings_fn = nnx.jit(lambda m, px: m.image_embeddings(px))
forward_fn = nnx.jit(ov.forward_actions)
generate_fn = nnx.jit(ov.generate_actions, static_argnames="num_tokens")


def images(batch, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, 6, IMAGE, IMAGE)).astype(np.float32)


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
        theirs = ref.logits(torch.tensor(x[row : row + 1]), torch.tensor(ids[row : row + 1, n:]))[0].numpy()
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
    actions = np.random.default_rng(4).integers(VOCAB_END - BINS, VOCAB_END, (len(PADS), A))
    out = forward_fn(model, jnp.asarray(ids), jnp.asarray(mask), nhwc(x), jnp.asarray(actions), 1.0)
    expected = []
    for row, n in enumerate(PADS):
        seq = np.concatenate([ids[row, n:], actions[row, :-1]])[None]
        logits = ref.logits(torch.tensor(x[row : row + 1]), torch.tensor(seq))[0].numpy()
        expected.append(restricted_logprobs(logits[-A:], actions[row]))
    expected = np.stack(expected)
    ours = np.asarray(out.token_logprobs)
    assert np.abs(ours - expected).max() <= TOL
    per_action = at.reduce_logprobs(out.token_logprobs, ACTION_DIM, "action")
    np.testing.assert_allclose(np.asarray(per_action), expected.reshape(3, 2, 7).sum(-1), atol=TOL)
    chunk = at.reduce_logprobs(out.token_logprobs, ACTION_DIM, "chunk")
    np.testing.assert_allclose(np.asarray(chunk), expected.sum(-1), atol=TOL)
    # Entropy of the restricted distribution, from the torch logits.
    assert np.all(np.asarray(out.entropy) > 0) and np.all(np.asarray(out.entropy) <= np.log(BINS) + 1e-5)


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
            logits = ref.logits(torch.tensor(x[row : row + 1]), torch.tensor([seq]))[0, -1].numpy()
            seq.append(lo + int(np.argmax(logits[lo:VOCAB_END])))
        np.testing.assert_array_equal(np.asarray(out.action_ids[row]), seq[-ACTION_DIM:])
    # The decoder's log-probs are the teacher-forced ones of the tokens it chose.
    tf = forward_fn(model, jnp.asarray(ids), jnp.asarray(mask), nhwc(x), out.action_ids, 1.0)
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(tf.token_logprobs), atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.value_hidden), np.asarray(tf.value_hidden), atol=1e-5)


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
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(tf.token_logprobs), atol=1e-5)


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
    x = np.concatenate([np.linspace(-1.2, 1.2, 1001), [-1.0, 1.0, 0.0]]).astype(np.float32)
    bins = np.linspace(-1, 1, 256)
    expected = 32000 - np.digitize(np.clip(x, -1, 1), bins)
    ids = np.asarray(tok.encode(jnp.asarray(x)))
    np.testing.assert_array_equal(ids, expected)
    assert ids.min() == 31744 and ids.max() == 31999
    assert ids[np.argmin(x)] == 31999  # reverse order: the most negative action is the last id
    centers = (bins[:-1] + bins[1:]) / 2
    np.testing.assert_allclose(
        np.asarray(tok.decode(jnp.asarray(ids))),
        centers[np.clip(32000 - ids - 1, 0, 254)],
        atol=1e-7,
    )
    stats = at.ActionStats.from_norm_stats({"d": {"action": {"q01": Q01, "q99": Q99, "mask": MASK}}})
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
        "vision_backbone.featurizer.blocks.0.attn.extra.weight": np.zeros((2, 2), np.float32),
    }
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(BadInput, match=r"'vision_backbone\.featurizer\.blocks\.0\.attn\.extra\.weight'"):
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
        kw = {k: spec[k] for k in ("embed_dim", "depth", "num_heads", "mlp_ratio", "patch_size")}
        kw.update(
            class_token=spec.get("class_token", True),
            reg_tokens=spec.get("reg_tokens", 0),
        )
        kw.update(
            no_embed_class=spec.get("no_embed_class", False),
            init_values=spec.get("init_values"),
        )
        vit = timm.create_model(name, pretrained=False, num_classes=0, img_size=IMAGE, **kw).eval()
        sd = {
            k[len(prefix) :].replace("scale_factor", "gamma"): torch.tensor(v)
            for k, v in ckpt.items()
            if k.startswith(prefix)
        }
        vit.load_state_dict(sd, strict=True)
        with torch.no_grad():
            feats = vit.get_intermediate_layers(x[:, 3 * i : 3 * i + 3], n={DEPTH - 2})[0]
            hf = (ref.dino if i == 0 else ref.siglip)(pixel_values=x[:, 3 * i : 3 * i + 3], output_hidden_states=True)
            want = hf.hidden_states[DEPTH - 1][:, (1 + REGS) if i == 0 else 0 :]
        assert (feats - want).abs().max() <= TOL, (name, ours)
