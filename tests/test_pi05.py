"""pi0.5 against lerobot's torch pi0.5 on the same random weights, and its RL chains.

The reference is ``lerobot.policies.pi05`` (lerobot 0.4.4, openpi's transformers 4.53.3,
torch 2.10), whose pins conflict with ours: ``tests/reference/lerobot_pi05.py`` runs it in
its own environment (``tests/reference/lerobot_env.py``) and writes a small random pi0.5
(8-head Gemmas of width 64 and 32, a 2-layer SigLIP on 28 px images, 5-action chunks of 4
dims), its inputs and its outputs to ``tests/data/pi05_lerobot``. Those files are kept in
the repository, so the comparison runs everywhere; where the environment is built, the
slow test below rewrites them with lerobot and checks they are what is kept. Two cameras,
the second missing in row 1, and right-padded prompts exercise masks and positions. fp32
must agree to 1e-4.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from rlinf_jax.errors import BadInput
from rlinf_jax.policies import convert as registry
from rlinf_jax.policies.convert import pi05 as pi05_convert
from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.model import CausalLM
from rlinf_jax.policies.vla import flow_steps
from rlinf_jax.policies.vla.flow_model import time_embedding
from rlinf_jax.policies.vla.pi05 import Pi05, Pi05Config, discretize_state
from tests import lerobot_reference

REFERENCE = Path(__file__).parent / "data" / "pi05_lerobot"


@pytest.fixture(scope="module")
def io():
    return lerobot_reference.load_io(REFERENCE)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return lerobot_reference.converted(REFERENCE, tmp_path_factory.mktemp("pi05"))


def prefix_inputs(model, io):
    """lerobot's prefix (each camera's patches, then the prompt) as our ids, mask and pixels."""
    c = model.config.paligemma
    B, cameras = io["images"].shape[:2]
    n = c.tokens_per_image
    ids = np.concatenate([np.full((B, cameras * n), c.image_token_id), io["tokens"]], 1)
    mask = np.concatenate([np.repeat(io["img_masks"], n, axis=1), io["masks"]], 1)
    pixels = np.moveaxis(io["images"], 2, -1)  # [B, cameras, H, W, C]
    return jnp.asarray(ids), jnp.asarray(pixels), jnp.asarray(mask)


encode = jax.jit(lambda m, *a: m.encode_prefix(*a))
velocity = jax.jit(lambda m, p, x, t: m.velocity(p, None, x, t))


def test_pi05_matches_lerobot(converted, io):
    m = converted
    prefix = encode(m, *prefix_inputs(m, io))
    # One denoising step over the prefix's cache.
    v = np.asarray(velocity(m, prefix, jnp.asarray(io["x_t"]), jnp.asarray(io["time"])))
    assert v.shape == io["velocity"].shape and np.abs(v - io["velocity"]).max() <= 1e-4
    assert io["velocity"].std() > 0.5
    # The training forward pass's per-element flow-matching loss (lerobot runs prefix and
    # suffix jointly there, layer by layer).
    loss = jax.jit(lambda m, p, *a: m.flow_matching_loss(p, None, *a))(
        m, prefix, jnp.asarray(io["actions"]), jnp.asarray(io["noise"]), jnp.asarray(io["time"]))
    assert np.abs(np.asarray(loss) - io["loss"]).max() <= 1e-4 * max(1.0, float(np.abs(io["loss"]).max()))
    # A full 4-step sample from the same noise.
    sample = jax.jit(lambda m, p, n: m.sample_actions(p, None, n, 4))(m, prefix, jnp.asarray(io["noise"]))
    assert np.abs(np.asarray(sample) - io["sample"]).max() <= 1e-4
    assert np.abs(io["sample"] - io["noise"]).max() > 0.5  # the chain moved
    # The time embedding is the torch port's float64 one, to float32 precision.
    emb = time_embedding(jnp.asarray(io["emb_times"], jnp.float32), 32, 4e-3, 4.0, exact=True)
    assert np.abs(np.asarray(emb) - io["time_emb"]).max() <= 1e-6


def test_pi05_key_layouts_and_leftover_keys(converted, tmp_path):
    """PI05Pytorch's own keys (no ``model.``) load the same parameters; an unknown tensor and
    a missing one are each named in a BadInput."""
    tensors = load_file(REFERENCE / "model.safetensors")

    def write(name, weights):
        (tmp_path / name).mkdir()
        shutil.copy(REFERENCE / "config.json", tmp_path / name / "config.json")
        save_file(weights, str(tmp_path / name / "model.safetensors"))
        return tmp_path / name

    bare = pi05_convert.from_pretrained(write("bare", {k.removeprefix("model."): v for k, v in tensors.items()}))
    for x, y in zip(jax.tree.leaves(nnx.state(bare)), jax.tree.leaves(nnx.state(converted)), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    extra = {**tensors, "model.time_mlp_mid.weight": np.zeros((4, 4), np.float32)}
    with pytest.raises(BadInput, match=r"time_mlp_mid"):
        pi05_convert.from_pretrained(write("extra", extra))
    short = {k: v for k, v in tensors.items() if "input_layernorm.dense.bias" not in k}
    with pytest.raises(BadInput, match=r"attn_norm\.dense\.bias"):
        pi05_convert.from_pretrained(write("short", short))


def test_pi05_rl_chains_rescore_and_the_value_reads_the_prefix(io, tmp_path):
    """With fresh RL heads: a flow-SDE and a flow-noise chain re-scored under the same
    parameters give the rollout's log-probs, and the value is the same at any point of the
    flow (it reads the pooled prefix, not the actions)."""
    m = pi05_convert.from_pretrained(REFERENCE, value_hidden=(16,), noise_hidden=(16,))
    prefix = encode(m, *prefix_inputs(m, io))
    for method in flow_steps.METHODS:
        out = jax.jit(lambda m, p, k, method=method: m.sample_with_logprob(p, None, k, method=method, num_steps=4))(
            m, prefix, jax.random.key(0))
        logp, value = jax.jit(lambda m, p, c, s, method=method: m.chain_logprob(p, None, c, s, method=method))(
            m, prefix, out.chain, out.stochastic_step)
        np.testing.assert_allclose(np.asarray(logp), np.asarray(out.logprob), atol=2e-4)
        np.testing.assert_allclose(np.asarray(value), np.asarray(out.value), atol=1e-6)
    outputs = jax.jit(lambda m, p, x, t: m.outputs(p, None, x, t))
    a = outputs(m, prefix, jnp.asarray(io["x_t"]), jnp.full((2,), 0.9))
    b = outputs(m, prefix, jnp.asarray(io["noise"]), jnp.full((2,), 0.2))
    np.testing.assert_array_equal(np.asarray(a[2]), np.asarray(b[2]))
    assert np.abs(np.asarray(a[0]) - np.asarray(b[0])).max() > 1e-2 and float(jnp.abs(a[2]).max()) > 0
    assert a[1] is not None and float(a[1].min()) >= 0.08 - 1e-6 and float(a[1].max()) <= 0.16 + 1e-6
    # Recorded in the converted directory and back on load.
    out_dir = pi05_convert.convert(REFERENCE, tmp_path / "rl", value_hidden=(16,))
    assert json.loads((out_dir / "config.json").read_text())["rlinf_rl_heads"]["value_hidden"] == [16]
    assert registry.load_converted(out_dir).value_head is not None


def test_state_bins_are_openpis():
    """The state's bins are numpy's digitize over 256 equal bins of [-1, 1], minus one."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-1, 1, 500), np.linspace(-1, 1, 257)[:-1], [1.0, 0.999999]]).astype(np.float32)
    want = np.digitize(x, np.linspace(-1, 1, 257)[:-1]) - 1
    np.testing.assert_array_equal(np.asarray(discretize_state(jnp.asarray(x))), want)
    assert int(discretize_state(jnp.asarray([-3.0]))[0]) == 0 and int(discretize_state(jnp.asarray([5.0]))[0]) == 255


@pytest.mark.parametrize("change, message", [
    ({"type": "pi0"}, "type='pi0' is not 'pi05'"),
    ({"paligemma_variant": "gemma_7b"}, "paligemma_variant='gemma_7b' is not one of gemma_300m, gemma_2b"),
    ({"action_expert_variant": {"width": 32}}, "action_expert_variant lacks depth"),
    ({"image_resolution": [224, 256]}, "must be square"),
])
def test_bad_pi05_configs_are_named(change, message):
    hf = {**json.loads((REFERENCE / "config.json").read_text()), **change}
    with pytest.raises(BadInput, match=message.replace("[", r"\[").replace("(", r"\(")):
        Pi05Config.from_lerobot_config(hf)


def test_adaptive_norms_need_their_condition_and_plain_ones_refuse_it(tmp_path):
    base = {"model_type": "gemma", "vocab_size": 11, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4}
    adaptive = CausalLM(LMConfig.from_hf_config({**base, "use_adarms": True, "adarms_cond_dim": 6}), rngs=nnx.Rngs(0))
    plain = CausalLM(LMConfig.from_hf_config(base), rngs=nnx.Rngs(0))
    ids = jnp.ones((4, 3), jnp.int32)
    assert adaptive.hidden_states(ids, cond=jnp.ones((4, 6))).shape == (4, 3, 8)
    with pytest.raises(BadInput, match=r"\[batch=4, cond_dim=6\]"):
        adaptive.hidden_states(ids, cond=jnp.ones((2, 6)))
    with pytest.raises(BadInput, match="pass cond="):
        adaptive.hidden_states(ids)
    with pytest.raises(BadInput, match="plain"):
        plain.hidden_states(ids, cond=jnp.ones((4, 6)))
    # A lerobot policy of another family is named, not sent to a converter that fails oddly.
    (tmp_path / "config.json").write_text(json.dumps({"type": "pi0"}))
    with pytest.raises(BadInput, match="lerobot 'pi0' policy"):
        registry.convert(tmp_path, tmp_path / "out")


def test_published_sizes_are_pi05s():
    """The default config.json builds lerobot's PI05Pytorch parameter for parameter: 3,616,757,520
    counted there (built on torch's meta device, tests/reference's environment), less the
    263,323,648 of the expert's token head, which pi0.5 never reads and we do not build."""
    c = Pi05Config.from_lerobot_config({"type": "pi05"})
    model = nnx.eval_shape(lambda: Pi05(c, rngs=nnx.Rngs(0)))
    assert sum(v.get_value().size for _, v in nnx.to_flat_state(nnx.state(model))) == 3_616_757_520 - 263_323_648
    text, expert, vision = c.paligemma.text, c.expert, c.paligemma.vision
    assert (text.hidden_size, text.num_layers, text.intermediate_size, text.vocab_size) == (2048, 18, 16384, 257152)
    assert (expert.hidden_size, expert.intermediate_size, expert.adarms_cond_dim, expert.head_dim) == (1024, 4096,
                                                                                                      1024, 256)
    assert (vision.hidden_size, vision.num_layers, vision.image_size, c.paligemma.tokens_per_image) == (1152, 27,
                                                                                                      224, 256)
    assert (c.chunk_size, c.max_action_dim, c.num_steps) == (50, 32, 10)


@pytest.mark.slow
def test_kept_reference_is_what_lerobot_computes(tmp_path, io):
    """Rewrites the reference with lerobot itself and compares it with the kept files."""
    lerobot_reference.check_rewritten("lerobot_pi05.py", REFERENCE, tmp_path / "ref", io)
