"""GR00T-N1.5 against lerobot's torch GR00T on the same random weights, and its RL chains.

The reference is ``lerobot.policies.groot`` (lerobot 0.4.4: the Eagle-2.5-VL backbone and
the flow-matching DiT head), run in its own environment (``tests/reference/lerobot_env.py``)
by ``tests/reference/lerobot_gr00t.py``, which writes a small random GR00T (a 2-layer SigLIP
on 56 px images, a Qwen3 cut to 2 of 3 layers, a 4-layer DiT that cross-attends in even
layers, 2 self-attention layers over the features, 3 embodiments, 5-action chunks of 6 dims)
with the published options, its inputs and its outputs to ``tests/data/gr00t_lerobot``.
Those files are kept in the repository, so the comparison runs everywhere; where the
environment is built, the slow test rewrites them with lerobot and checks they are what is
kept. Two cameras, a right-padded prompt and a different embodiment per row exercise the
image slots, the padding GR00T attends over and the per-embodiment layers. fp32 must agree
to 1e-4.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.convert import gr00t as gr00t_convert
from rlinf_jax.policies.convert import keys
from rlinf_jax.policies.lm.hf_checkpoint import dotted, read_hf_config
from rlinf_jax.policies.lm.published import PUBLISHED_EAGLE, PUBLISHED_GR00T
from rlinf_jax.policies.vla import flow_steps
from rlinf_jax.policies.vla.gr00t import Gr00t, Gr00tConfig
from tests import lerobot_reference

REFERENCE = Path(__file__).parent / "data" / "gr00t_lerobot"


@pytest.fixture(scope="module")
def io():
    return lerobot_reference.load_io(REFERENCE)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return lerobot_reference.converted(REFERENCE, tmp_path_factory.mktemp("gr00t"))


def observe(model, io):
    return model.encode_observation(jnp.asarray(io["input_ids"]), jnp.asarray(io["pixels"]),
                                    jnp.asarray(io["attention_mask"]), jnp.asarray(io["state"]),
                                    jnp.asarray(io["embodiment"]))


def close(ours, theirs, what):
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0, err_msg=what)


def test_gr00t_matches_lerobot(converted, io):
    m = converted
    close(m.backbone(jnp.asarray(io["input_ids"]), jnp.asarray(io["pixels"]), jnp.asarray(io["attention_mask"])),
          io["backbone_features"], "Eagle's layer-select_layer features")
    obs = observe(m, io)
    close(obs.features, io["processed_features"], "vlln + vl_self_attention")
    close(m.gr00t_velocity(obs, jnp.asarray(io["x"]), jnp.asarray(io["s_step"])), io["velocity"], "velocity")
    # GR00T's loss: the masked mean of the per-element error at its time s = 1 - t.
    per_element = m.flow_matching_loss(obs, None, jnp.asarray(io["actions"]), jnp.asarray(io["noise"]),
                                       1.0 - jnp.asarray(io["s_loss"]))
    loss = float(jnp.sum(per_element * io["action_mask"]) / io["action_mask"].sum())
    assert loss == pytest.approx(float(io["loss"]), abs=1e-4 * max(1.0, abs(float(io["loss"]))))
    close(m.sample_actions(obs, None, jnp.asarray(io["noise"]), 4), io["sample"], "4-step sample")


def test_pixel_shuffle_backbone_matches_lerobot(io):
    """The backbone's other path (2x2 pixel shuffle, LayerNorm + two-layer connector), from a
    second small Eagle whose checkpoint holds the backbone alone."""
    hf = read_hf_config(REFERENCE)
    eagle = json.loads((REFERENCE / "shuffle" / "eagle_config.json").read_text())
    config = Gr00tConfig.from_config(hf, eagle)
    model = Gr00t(config, rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    targets = {dotted(p): v.get_value() for p, v in nnx.to_flat_state(state)}
    files = [REFERENCE / "shuffle" / "model.safetensors"]
    backbone = {k: v for k, v in targets.items() if k.startswith(("vision_tower.", "connector_", "language_model."))}
    rows, skips = gr00t_convert.gr00t_rows(list(load_file(files[0])), config)
    values = keys.read_checkpoint(files, rows, skips, backbone, "GR00T backbone")
    assert sorted(values) == sorted(backbone)  # every backbone parameter filled, nothing left over
    for path, value in values.items():
        node = model
        for part in path.split("."):
            node = node[int(part)] if part.isdigit() else getattr(node, part)
        node.set_value(jnp.asarray(value))
    feats = model.backbone(jnp.asarray(io["shuffle_input_ids"]), jnp.asarray(io["pixels"]),
                           jnp.asarray(io["shuffle_attention_mask"]))
    image_tokens = (io["shuffle_input_ids"] == config.eagle.image_token_id).sum(axis=1)
    assert config.eagle.tokens_per_image == 4 and list(image_tokens) == [2 * 4] * 3  # 16 patches -> 4, 2 cameras
    close(feats, io["shuffle_features"], "pixel-shuffled Eagle features")


def test_gr00t_key_layouts_and_leftover_keys(tmp_path):
    """A lerobot GrootPolicy's ``_groot_model.`` keys load too, LM layers past select_layer
    are skipped by name, and a stray tensor is named."""
    tensors = load_file(REFERENCE / "model.safetensors")
    hf = read_hf_config(REFERENCE)
    policy = tmp_path / "policy"
    policy.mkdir()
    extra = {"backbone.eagle_model.language_model.model.layers.2.input_layernorm.weight": np.ones(48, np.float32)}
    save_file({"_groot_model." + k: v for k, v in {**tensors, **extra}.items()}, str(policy / "model.safetensors"))
    (policy / "config.json").write_text(json.dumps(hf))
    ours = gr00t_convert.from_pretrained(policy)
    reference = gr00t_convert.from_pretrained(REFERENCE)
    for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(ours)), nnx.to_flat_state(nnx.state(reference))):
        assert np.array_equal(np.asarray(a.get_value()), np.asarray(b.get_value())), path
    stray = tmp_path / "stray"
    shutil.copytree(REFERENCE, stray, ignore=shutil.ignore_patterns("shuffle"))
    save_file({**tensors, "action_head.extra.weight": np.zeros(3, np.float32)}, str(stray / "model.safetensors"))
    with pytest.raises(BadInput, match="action_head.extra.weight"):
        gr00t_convert.from_pretrained(stray)


def test_gr00t_rl_chains_rescore_and_the_value_reads_the_observation(io):
    hf = read_hf_config(REFERENCE)
    model = gr00t_convert.from_pretrained(REFERENCE, value_hidden=(16,), noise_hidden=(16,))
    assert model.config == gr00t_convert.gr00t_config(hf, value_hidden=(16,), noise_hidden=(16,))
    obs = observe(model, io)
    for method in flow_steps.METHODS:
        out = model.sample_with_logprob(obs, None, jax.random.key(3), method=method, num_steps=4)
        logprob, value = model.chain_logprob(obs, None, out.chain, out.stochastic_step, method=method)
        np.testing.assert_allclose(np.asarray(logprob), np.asarray(out.logprob), rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(np.asarray(value), np.asarray(out.value), rtol=1e-6)
    B, H, A = io["x"].shape
    at = [model.outputs(obs, None, jnp.asarray(x), jnp.full((B,), t))[2]
          for x, t in ((io["x"], 0.3), (io["noise"], 0.9))]
    np.testing.assert_allclose(np.asarray(at[0]), np.asarray(at[1]), rtol=1e-6)


@pytest.mark.parametrize("change, message", [
    (lambda hf: hf["action_head_cfg"]["diffusion_model_cfg"].update(attention_head_dim=8), "input_embedding_dim"),
    (lambda hf: hf["action_head_cfg"].update(hidden_size=24), "output_dim"),
    (lambda hf: hf["backbone_cfg"].update(select_layer=9), "select_layer=9"),
    (lambda hf: hf.update(model_type="gr00t_n2"), "model_type='gr00t_n2'"),
    (lambda hf: hf["action_head_cfg"]["diffusion_model_cfg"].update(norm_type="layer_norm"), "norm_type"),
])
def test_bad_gr00t_configs_are_named(change, message):
    hf = read_hf_config(REFERENCE)
    change(hf)
    with pytest.raises(BadInput, match=message):
        gr00t_convert.gr00t_config(hf)


def test_published_sizes_are_gr00t_n15s():
    """At the published sizes our GR00T-N1.5 has lerobot's parameter count: 2,413,522,880
    (lerobot's modules at these sizes, counted on torch's meta device by
    ``tests/reference/lerobot_gr00t.py --count``; the slow test below recounts), of which the
    DiT's 550,386,688 and the feature stack's 201,433,088 are what lerobot prints when it
    loads the published checkpoint."""
    c = Gr00tConfig.from_config(PUBLISHED_GR00T, PUBLISHED_EAGLE)
    model = nnx.eval_shape(lambda: Gr00t(c, rngs=nnx.Rngs(0)))

    def count(module):
        return sum(v.get_value().size for _, v in nnx.to_flat_state(nnx.state(module)))

    assert count(model) == 2_413_522_880
    assert (count(model.dit), count(model.vl_self_attention)) == (550_386_688, 201_433_088)
    assert (c.eagle.text.num_layers, c.eagle.tokens_per_image, c.backbone_dim, c.chunk_size, c.num_steps) == (
        12, 256, 2048, 16, 4)


@pytest.mark.slow
def test_kept_reference_is_what_lerobot_computes(tmp_path, io):
    """Rewrites the reference with lerobot itself and compares it with the kept files, and
    recounts the published size with lerobot's modules."""
    python = lerobot_reference.check_rewritten("lerobot_gr00t.py", REFERENCE, tmp_path / "ref", io,
                                               ("model.safetensors", "shuffle/model.safetensors"))
    sizes = json.dumps({"eagle": PUBLISHED_EAGLE, "gr00t": PUBLISHED_GR00T})
    counted = subprocess.run([python, str(lerobot_reference.SCRIPTS / "lerobot_gr00t.py"), "--count"],
                             input=sizes, check=True, capture_output=True, text=True)
    assert int(counted.stdout.strip().splitlines()[-1]) == 2_413_522_880
