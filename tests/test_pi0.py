"""PaliGemma and pi0 against transformers' torch models on the same random weights, and the
RL log-probs of flow-SDE / flow-noise against hand-written Gaussian densities.

Tiny models from config classes, every parameter random (SigLIP's LayerNorm weights around
1, Gemma's norm weights around 0 since Gemma adds the 1): 28 px images in 14 px patches,
hidden 48 with 3 query heads on 1 KV head (head_dim 20), vocabulary 301 with the image token
last, an action expert of width 36 with 2 heads, chunks of 5 actions of 4 dims, 6-dim state.
Prompts are left-padded and the pi0 batch has a missing second camera in one row, so the
image-token placement, padding masks and positions are all exercised. fp32 must agree to 1e-4.
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlinf_jax.errors import BadInput
from rlinf_jax.policies import convert as registry
from rlinf_jax.policies.convert import pi0 as pi0_convert
from rlinf_jax.policies.vla import flow_steps
from rlinf_jax.policies.vla.pi0 import time_embedding

torch.set_num_threads(1)
IMAGE_TOKEN, VOCAB, N_PATCH = 300, 301, 4
TEXT = {
    "model_type": "gemma", "hidden_size": 48, "intermediate_size": 88, "num_hidden_layers": 2,
    "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 20, "vocab_size": VOCAB,
}
VISION = {
    "model_type": "siglip_vision_model", "hidden_size": 48, "intermediate_size": 72, "num_hidden_layers": 2,
    "num_attention_heads": 3, "image_size": 28, "patch_size": 14, "vision_use_head": False,
}
VLM = {"text_config": TEXT, "vision_config": VISION, "projection_dim": 48, "image_token_index": IMAGE_TOKEN,
       "vocab_size": VOCAB}
EXPERT = {
    "model_type": "gemma", "hidden_size": 36, "intermediate_size": 56, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 20,
}
H, A, S_DIM = 5, 4, 6


def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if p.is_floating_point():
                noise = torch.randn(p.shape, generator=gen) * 0.25
                layer_norm = ("layer_norm" in name or "layernorm" in name) and name.endswith("weight")
                p.copy_(noise + (1.0 if layer_norm else 0.0))


def eager(config):
    for sub in (config, config.get_text_config(), *(getattr(config, k) for k in ("vlm_config", "dit_config",
                                                                                  "vision_config") if hasattr(config, k))):
        sub._attn_implementation = "eager"
    if hasattr(config, "vlm_config"):
        eager(config.vlm_config)


@pytest.fixture(scope="module")
def paligemma(tmp_path_factory):
    config = transformers.PaliGemmaConfig(**VLM)
    eager(config)
    hf = transformers.PaliGemmaForConditionalGeneration(config).eval()
    randomize(hf, 0)
    path = tmp_path_factory.mktemp("paligemma")
    hf.save_pretrained(path)
    return path, hf, pi0_convert.paligemma_from_pretrained(path)


@pytest.fixture(scope="module")
def pi0(tmp_path_factory):
    config = transformers.PI0Config(vlm_config=VLM, dit_config=EXPERT, chunk_size=H, max_state_dim=S_DIM,
                                    max_action_dim=A)
    eager(config)
    hf = transformers.PI0ForConditionalGeneration(config).eval()
    randomize(hf, 1)
    path = tmp_path_factory.mktemp("pi0")
    hf.save_pretrained(path)
    ours = pi0_convert.from_pretrained(path, value_hidden=(16,), noise_hidden=(16, 8))
    return path, hf, ours


def prompts(rng, image_tokens, length):
    """Left-padded rows: ``image_tokens[b]`` image tokens, then text, right-aligned."""
    ids = np.zeros((len(image_tokens), length), np.int64)
    mask = np.zeros_like(ids)
    for b, n in enumerate(image_tokens):
        text = rng.integers(1, IMAGE_TOKEN, length - n - b * 2)
        row = np.concatenate([np.full(n, IMAGE_TOKEN), text])
        ids[b, length - len(row):] = row
        mask[b, length - len(row):] = 1
    return ids, mask


def channels_last(px):
    return jnp.asarray(np.moveaxis(px, -3, -1))


# -- PaliGemma ---------------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional_prefix", [True, False])
def test_paligemma_logits_match_transformers(paligemma, bidirectional_prefix):
    _path, hf, ours = paligemma
    rng = np.random.default_rng(0)
    ids, mask = prompts(rng, [N_PATCH, N_PATCH], 11)
    px = rng.standard_normal((2, 3, 28, 28)).astype(np.float32)
    token_types = None
    if bidirectional_prefix:  # the last 3 tokens are the suffix
        token_types = np.zeros_like(ids)
        token_types[:, -3:] = 1
    pos = np.cumsum(mask, 1)  # transformers' PaliGemma counts from 1
    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(ids), pixel_values=torch.tensor(px), attention_mask=torch.tensor(mask),
            position_ids=torch.tensor(pos), token_type_ids=None if token_types is None else torch.tensor(token_types),
        ).logits.numpy()
    got = jax.jit(lambda m, *a: m(*a))(
        ours, jnp.asarray(ids), channels_last(px)[:, None], jnp.asarray(mask),
        None if token_types is None else jnp.asarray(token_types),
    )
    valid = mask.astype(bool)
    err = np.abs(np.asarray(got) - ref)[valid].max()
    assert got.shape == (2, 11, VOCAB) and err <= 1e-4, err
    assert ref[valid].std() > 1.0


# -- pi0: the network ----------------------------------------------------------------------


def pi0_inputs(seed=0):
    """Row 0: two cameras; row 1: the second camera missing, fewer image tokens, more padding."""
    rng = np.random.default_rng(seed)
    ids, mask = prompts(rng, [2 * N_PATCH, N_PATCH], 14)
    px = rng.standard_normal((2, 2, 3, 28, 28)).astype(np.float32)
    cameras = np.array([[True, True], [True, False]])
    state = rng.standard_normal((2, S_DIM)).astype(np.float32)
    return ids, mask, px, cameras, state, rng


def hf_kwargs(ids, mask, px, cameras, state):
    return {
        "state": torch.tensor(state), "input_ids": torch.tensor(ids), "pixel_values": torch.tensor(px),
        "attention_mask": torch.tensor(mask), "pixel_attention_mask": torch.tensor(cameras),
    }


# Jitted once here so that every test (and every model of the same shapes) shares the compilations.
_encode = jax.jit(lambda m, *a: m.encode_prefix(*a))
velocity = jax.jit(lambda m, p, s, x, t: m.velocity(p, s, x, t))
expert_hidden = jax.jit(lambda m, p, s, x, t: m.expert_hidden(p, s, x, t))


def encode(ours, ids, mask, px, cameras):
    return _encode(ours, jnp.asarray(ids), channels_last(px), jnp.asarray(mask), jnp.asarray(cameras))


def test_pi0_velocity_matches_transformers(pi0):
    _path, hf, ours = pi0
    ids, mask, px, cameras, state, rng = pi0_inputs()
    x_t = rng.standard_normal((2, H, A)).astype(np.float32)
    t = np.array([0.73, 0.21], np.float32)
    with torch.no_grad():
        ref = hf(noise=torch.tensor(x_t), timestep=torch.tensor(t), **hf_kwargs(ids, mask, px, cameras, state))
    prefix = encode(ours, ids, mask, px, cameras)
    v = velocity(ours, prefix, jnp.asarray(state), jnp.asarray(x_t), jnp.asarray(t))
    err = np.abs(np.asarray(v) - ref.logits.numpy()).max()
    assert v.shape == (2, H, A) and err <= 1e-4, err
    assert ref.logits.std() > 0.5
    # The sinusoidal time embedding is transformers' (same float32 frequencies).
    emb = np.asarray(time_embedding(jnp.asarray(t), EXPERT["hidden_size"], 4e-3, 4.0))
    with torch.no_grad():
        ref_emb = hf.embed_action_time.sinusoid_embeds(torch.tensor(t)).numpy()
    assert np.abs(emb - ref_emb).max() <= 1e-6
    # The flow-matching training loss is transformers' (its mean is their MSE).
    actions = rng.standard_normal((2, H, A)).astype(np.float32)
    noise = rng.standard_normal((2, H, A)).astype(np.float32)
    with torch.no_grad():
        ref_loss = hf(noise=torch.tensor(noise), timestep=torch.tensor(t), actions=torch.tensor(actions),
                      **hf_kwargs(ids, mask, px, cameras, state)).loss.item()
    loss = jax.jit(lambda m, p, *a: m.flow_matching_loss(p, *a))(
        ours, prefix, jnp.asarray(state), jnp.asarray(actions), jnp.asarray(noise), jnp.asarray(t))
    assert abs(float(loss.mean()) - ref_loss) <= 1e-4 * max(1.0, ref_loss)


def test_pi0_ten_step_sample_matches_transformers(pi0):
    _path, hf, ours = pi0
    ids, mask, px, cameras, state, rng = pi0_inputs(1)
    noise = rng.standard_normal((2, H, A)).astype(np.float32)
    with torch.no_grad():
        ref = hf.sample_actions(noise=torch.tensor(noise), num_steps=10, **hf_kwargs(ids, mask, px, cameras, state))
    prefix = encode(ours, ids, mask, px, cameras)
    got = jax.jit(lambda m, p, s, n: m.sample_actions(p, s, n, 10))(ours, prefix, jnp.asarray(state),
                                                                      jnp.asarray(noise))
    err = np.abs(np.asarray(got) - ref.numpy()).max()
    assert err <= 1e-4, err
    assert np.abs(ref.numpy() - noise).max() > 0.5  # the chain moved


def test_state_token_and_value_ignore_the_noisy_actions(pi0):
    _path, _hf, ours = pi0
    ids, mask, px, cameras, state, rng = pi0_inputs(2)
    prefix = encode(ours, ids, mask, px, cameras)
    hidden = expert_hidden
    a = hidden(ours, prefix, jnp.asarray(state), jnp.asarray(rng.standard_normal((2, H, A)), jnp.float32),
               jnp.full((2,), 0.9))
    b = hidden(ours, prefix, jnp.asarray(state), jnp.asarray(rng.standard_normal((2, H, A)), jnp.float32),
               jnp.full((2,), 0.2))
    np.testing.assert_allclose(np.asarray(a[:, 0]), np.asarray(b[:, 0]), atol=1e-6)
    assert np.abs(np.asarray(a[:, 1:]) - np.asarray(b[:, 1:])).max() > 1e-2


# -- RL log-probs against hand Gaussians ---------------------------------------------------------


def gauss(x, mean, std):
    return -0.5 * ((x - mean) / std) ** 2 - np.log(std) - 0.5 * math.log(2 * math.pi)


def test_flow_sde_logprob_is_the_hand_gaussian_of_its_stochastic_step(pi0):
    _path, _hf, ours = pi0
    ids, mask, px, cameras, state, _rng = pi0_inputs(3)
    prefix = encode(ours, ids, mask, px, cameras)
    N, a = 10, 0.5
    steps = jnp.asarray([0, 6])  # t = 1 (the special-cased sigma) and an interior step
    out = jax.jit(lambda m, p, s, k: m.sample_with_logprob(p, s, k, method="flow_sde", num_steps=N,
                                                             noise_level=a, stochastic_step=steps))(
        ours, prefix, jnp.asarray(state), jax.random.key(0))
    chain = np.asarray(out.chain, np.float64)
    assert chain.shape == (2, N + 1, H, A)
    np.testing.assert_array_equal(np.asarray(out.actions), np.asarray(out.chain[:, -1]))
    for k in range(N):
        t = 1.0 - k / N
        v = np.asarray(velocity(ours, prefix, jnp.asarray(state), out.chain[:, k], jnp.full((2,), t, jnp.float32)),
                       np.float64)
        euler = chain[:, k] - v / N
        for b in range(2):
            if k != int(steps[b]):  # deterministic steps are plain Euler steps
                np.testing.assert_allclose(chain[b, k + 1], euler[b], atol=1e-5)
                continue
            sigma = a * math.sqrt(t / (1 - t)) if t < 1 else a * math.sqrt(N)
            mean = euler[b] - sigma**2 / N / (2 * t) * (chain[b, k] + (1 - t) * v[b])
            std = math.sqrt(1 / N) * sigma
            want = gauss(chain[b, k + 1], mean, std)
            np.testing.assert_allclose(np.asarray(out.logprob[b]), want, atol=1e-4, rtol=1e-5)
            assert np.abs(chain[b, k + 1] - mean).max() > 1e-3  # the step really was noisy
    # Re-evaluating the stored chain gives the rollout's numbers; so does the value.
    logp, value = jax.jit(lambda m, p, s, c, k: m.chain_logprob(p, s, c, k, method="flow_sde", noise_level=a))(
        ours, prefix, jnp.asarray(state), out.chain, out.stochastic_step)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(out.logprob), atol=1e-4)
    np.testing.assert_allclose(np.asarray(value), np.asarray(out.value), atol=1e-6)
    assert np.abs(np.asarray(value)).max() > 0


@pytest.mark.slow
def test_flow_noise_logprob_is_the_sum_of_hand_gaussians(pi0):
    _path, _hf, ours = pi0
    ids, mask, px, cameras, state, _rng = pi0_inputs(4)
    prefix = encode(ours, ids, mask, px, cameras)
    N = 4
    out = jax.jit(lambda m, p, s, k: m.sample_with_logprob(p, s, k, method="flow_noise", num_steps=N))(
        ours, prefix, jnp.asarray(state), jax.random.key(1))
    layers = nnx.to_pure_dict(nnx.state(ours.noise_head))["layers"]
    params = [(np.asarray(layers[i]["kernel"], np.float64), np.asarray(layers[i]["bias"], np.float64)) for i in range(3)]
    lo, hi = 2 * math.log(0.08), 2 * math.log(0.16)

    def noise_std(hidden):  # the noise head by hand: Dense-tanh-Dense-tanh-Dense, tanh-squashed log-variance
        h = hidden
        for i, (kernel, bias) in enumerate(params):
            h = h @ kernel + bias
            if i < 2:
                h = np.tanh(h)
        return np.exp(0.5 * (lo + (hi - lo) * (np.tanh(h) + 1) / 2))

    total = np.zeros((2, H, A))
    chain = np.asarray(out.chain, np.float64)
    for k in range(N):
        t = 1.0 - k / N
        hidden = expert_hidden(ours, prefix, jnp.asarray(state), out.chain[:, k], jnp.full((2,), t, jnp.float32))
        v = np.asarray(ours.action_out_proj(hidden[:, 1:].reshape(-1, 36)).reshape(2, H, A), np.float64)
        std = noise_std(np.asarray(hidden[:, 1:], np.float64))
        assert 0.08 - 1e-6 <= std.min() and std.max() <= 0.16 + 1e-6
        total += gauss(chain[:, k + 1], chain[:, k] - v / N, std)
    np.testing.assert_allclose(np.asarray(out.logprob), total, atol=2e-4, rtol=1e-5)
    assert (np.asarray(out.stochastic_step) == -1).all()
    # Re-evaluating the stored chain gives the rollout's numbers, and its gradient reaches the
    # noise head (what flow-noise trains).
    def summed(m):
        logp, _ = m.chain_logprob(prefix, jnp.asarray(state), out.chain, out.stochastic_step, method="flow_noise")
        return logp.sum(), logp

    (_, logp), grads = nnx.jit(nnx.value_and_grad(summed, has_aux=True))(ours)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(out.logprob), atol=2e-4)
    assert float(jnp.abs(grads.noise_head.layers[0].kernel[...]).max()) > 0


def test_flow_step_helpers_against_hand_formulas():
    np.testing.assert_allclose(flow_steps.step_times(4), [1.0, 0.75, 0.5, 0.25])
    np.testing.assert_allclose(flow_steps.sde_sigmas(4, 0.5), [0.5 * 2, 0.5 * math.sqrt(3), 0.5, 0.5 / math.sqrt(3)],
                               rtol=1e-6)
    x, v = np.array([0.3, -1.2]), np.array([2.0, 0.5])
    mean, std = flow_steps.sde_step(jnp.asarray(x), jnp.asarray(v), 0.75, 0.25, 0.0)
    np.testing.assert_allclose(np.asarray(mean), x - 0.25 * v, rtol=1e-6)  # sigma 0: Euler
    assert float(jnp.abs(std).max()) == 0
    lp = flow_steps.gaussian_logprob(jnp.asarray([0.5, 1.0]), jnp.asarray([0.1, 1.0]), jnp.asarray([0.3, 0.0]))
    np.testing.assert_allclose(np.asarray(lp), [gauss(0.5, 0.1, 0.3), 0.0], rtol=1e-6)


# -- conversion ----------------------------------------------------------------------------


@pytest.mark.slow
def test_registry_converts_and_loads_pi0_and_paligemma(pi0, paligemma, tmp_path):
    path, _hf, ours = pi0
    out = registry.convert(path, tmp_path / "pi0")
    back = registry.load_converted(out)
    assert back.value_head is None and back.noise_head is None  # the CLI converts the checkpoint only
    ids, mask, px, cameras, state, rng = pi0_inputs(5)
    x = jnp.asarray(rng.standard_normal((2, H, A)), jnp.float32)
    t = jnp.full((2,), 0.5)
    v = [np.asarray(velocity(m, encode(m, ids, mask, px, cameras), jnp.asarray(state), x, t)) for m in (ours, back)]
    np.testing.assert_array_equal(v[0], v[1])
    # RL heads asked for at conversion are recorded in config.json and come back on load.
    with_heads = pi0_convert.convert(path, tmp_path / "pi0_rl", value_hidden=(8,))
    assert json.loads((with_heads / "config.json").read_text())["rlinf_rl_heads"]["value_hidden"] == [8]
    assert registry.load_converted(with_heads).value_head is not None

    pg_path, _pg_hf, pg = paligemma
    pg_back = registry.load_converted(registry.convert(pg_path, tmp_path / "pg"))
    assert type(pg_back) is type(pg)


def test_in_memory_key_layout_and_leftover_keys(pi0, tmp_path):
    """transformers' in-memory names (model.vlm / model.dit / embed_action_time) load the same
    parameters; an unknown tensor is named in a BadInput, as is a missing one."""
    from safetensors.torch import save_file

    path, hf, ours = pi0
    state_dict = {k: v.contiguous() for k, v in hf.state_dict().items()}
    (tmp_path / "mem").mkdir()
    (tmp_path / "mem" / "config.json").write_text((path / "config.json").read_text())
    save_file(state_dict, str(tmp_path / "mem" / "model.safetensors"))
    again = pi0_convert.from_pretrained(tmp_path / "mem")
    a = jax.tree.leaves(nnx.state(again.paligemma))
    b = jax.tree.leaves(nnx.state(ours.paligemma))
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))

    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "config.json").write_text((path / "config.json").read_text())
    save_file({**state_dict, "model.dit.layers.0.mlp.gate_proj.bias": torch.zeros(56)},
              str(tmp_path / "extra" / "model.safetensors"))
    with pytest.raises(BadInput, match=r"model\.dit\.layers\.0\.mlp\.gate_proj\.bias"):
        pi0_convert.from_pretrained(tmp_path / "extra")

    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "config.json").write_text((path / "config.json").read_text())
    save_file({k: v for k, v in state_dict.items() if k != "action_out_proj.weight"},
              str(tmp_path / "short" / "model.safetensors"))
    with pytest.raises(BadInput, match="action_out_proj.kernel"):
        pi0_convert.from_pretrained(tmp_path / "short")
