"""Our SigLIP and DINOv2-with-registers ViTs against transformers' torch models.

Tiny models with awkward sizes (hidden 48, 3 heads of 16, patch 14, 28 or 56 px images, MLP
widths that are no multiple of anything) and every parameter random, layer scales and norm
weights included (``randn * scale``, plus 1 for norm weights), so a transposed matrix, a
wrong GELU, a missing CLS position or swapped q/k would show. Checked in fp32: patch
embeddings, every block's output, the final hidden state and SigLIP's pooled output, each
to 1e-4; then the same numbers through a converted directory (``convert`` + ``load``).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlinf_jax.errors import BadInput
from rlinf_jax.policies import convert as registry
from rlinf_jax.policies.convert import vision
from rlinf_jax.policies.vla.vit import ViT

torch.set_num_threads(1)
TOL = 1e-4

CONFIGS = {
    "siglip": lambda image: transformers.SiglipVisionConfig(
        hidden_size=48,
        intermediate_size=76,
        num_hidden_layers=3,
        num_attention_heads=3,
        image_size=image,
        patch_size=14,
        layer_norm_eps=1e-6,
        vision_use_head=True,
    ),
    "dinov2_reg": lambda image: transformers.Dinov2WithRegistersConfig(
        hidden_size=48,
        mlp_ratio=3,
        num_hidden_layers=3,
        num_attention_heads=3,
        image_size=image,
        patch_size=14,
        num_register_tokens=3,
        layerscale_value=0.5,
    ),
}
MODELS = {
    "siglip": transformers.SiglipVisionModel,
    "dinov2_reg": transformers.Dinov2WithRegistersModel,
}


def randomise(model, seed, scale=0.3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32) * scale
            is_norm = ("norm" in name or "layernorm" in name) and name.endswith("weight")
            p.copy_(noise + (1.0 if is_norm else 0.0))
    return model.eval()


@pytest.fixture(
    scope="module",
    params=[("siglip", 28), ("siglip", 56), ("dinov2_reg", 28), ("dinov2_reg", 56)],
    ids=lambda p: f"{p[0]}-{p[1]}px",
)
def pair(request, tmp_path_factory):
    kind, image = request.param
    config = CONFIGS[kind](image)
    config._attn_implementation = "eager"
    hf = randomise(MODELS[kind](config), seed=image)
    path = tmp_path_factory.mktemp(f"{kind}{image}")
    hf.save_pretrained(str(path))
    return kind, image, hf, path


def pixels(image, batch=2, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, 3, image, image)).astype(np.float32)


def test_every_parameter_is_random(pair):
    # Guards the premise of the parity checks: nothing left at an init constant.
    _kind, _image, hf, _path = pair
    for name, p in hf.state_dict().items():
        if name.endswith("mask_token"):
            continue
        assert p.numel() < 4 or p.std() > 0.1, name


def test_patch_embeddings_blocks_and_outputs_match(pair):
    kind, image, hf, path = pair
    model = vision.from_pretrained(path)
    x = pixels(image)
    ours_in = jnp.asarray(x.transpose(0, 2, 3, 1))
    with torch.no_grad():
        ref = hf(pixel_values=torch.tensor(x), output_hidden_states=True)
        conv = hf.embeddings.patch_embedding if kind == "siglip" else hf.embeddings.patch_embeddings.projection
        ref_patches = conv(torch.tensor(x)).flatten(2).transpose(1, 2).numpy()
    errs = {"patches": np.abs(np.asarray(model.patch_embed(ours_in)) - ref_patches).max()}
    ours_hidden = model.hidden_states(ours_in)
    assert len(ours_hidden) == len(ref.hidden_states) == 4
    for i, (a, b) in enumerate(zip(ours_hidden, ref.hidden_states)):
        errs[f"hidden{i}"] = np.abs(np.asarray(a) - b.numpy()).max()
    errs["last"] = np.abs(np.asarray(model(ours_in)) - ref.last_hidden_state.numpy()).max()
    if kind == "siglip":
        errs["pooled"] = np.abs(np.asarray(model.pooled(ours_in)) - ref.pooler_output.numpy()).max()
    assert max(errs.values()) <= TOL, errs
    # Patch features of the second-to-last block drop CLS and registers and skip the last block.
    prefix = 4 if kind == "dinov2_reg" else 0
    feats = np.asarray(model.patch_features(ours_in))
    assert feats.shape == (2, (image // 14) ** 2, 48)
    np.testing.assert_allclose(feats, ref.hidden_states[2][:, prefix:].numpy(), atol=TOL)


def test_converted_directory_round_trip(pair, tmp_path):
    _kind, image, hf, path = pair
    out = registry.convert(path, tmp_path / "out")
    model = registry.load_converted(out)
    assert isinstance(model, ViT)
    x = pixels(image, seed=1)
    with torch.no_grad():
        ref = hf(pixel_values=torch.tensor(x)).last_hidden_state.numpy()
    assert np.abs(np.asarray(model(jnp.asarray(x.transpose(0, 2, 3, 1)))) - ref).max() <= TOL


def test_leftover_and_missing_keys_are_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    config = CONFIGS["dinov2_reg"](28)
    hf = randomise(MODELS["dinov2_reg"](config), seed=3)
    hf.save_pretrained(str(tmp_path / "a"))
    tensors = load_file(str(tmp_path / "a" / "model.safetensors"))
    extra = {
        **tensors,
        "encoder.layer.0.attention.bogus.weight": np.zeros((2, 2), np.float32),
    }
    save_file(extra, str(tmp_path / "a" / "model.safetensors"))
    with pytest.raises(BadInput, match="'encoder.layer.0.attention.bogus.weight'"):
        vision.from_pretrained(tmp_path / "a")
    del tensors["encoder.layer.2.layer_scale2.lambda1"]
    save_file(tensors, str(tmp_path / "a" / "model.safetensors"))
    with pytest.raises(BadInput, match=r"blocks\.2\.ls2"):
        vision.from_pretrained(tmp_path / "a")


def test_convert_cli_handles_vision_towers(pair, tmp_path, capsys):
    # The CLI goes through the registry: a vision tower converts like a language model.
    import json as _json

    from rlinf_jax.cli import convert as convert_cli

    kind, image, hf, path = pair
    if image != 28:
        pytest.skip("one image size is enough for the CLI")
    assert convert_cli.main(["--from", str(path), "--to", str(tmp_path / "cli")]) == 0
    summary = _json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["model_type"] == hf.config.model_type
    # DINOv2's mask token only serves masked-image pretraining; the converter skips it.
    used = {n: p for n, p in hf.named_parameters() if not n.endswith("mask_token")}
    assert summary["params"] == sum(p.numel() for p in used.values())
    x = pixels(image, seed=2)
    with torch.no_grad():
        ref = hf(pixel_values=torch.tensor(x)).last_hidden_state.numpy()
    model = registry.load_converted(tmp_path / "cli")
    assert np.abs(np.asarray(model(jnp.asarray(x.transpose(0, 2, 3, 1)))) - ref).max() <= TOL
    # Converting onto it again is refused and leaves it as it was.
    before = sorted(p.name for p in (tmp_path / "cli").iterdir())
    assert convert_cli.main(["--from", str(path), "--to", str(tmp_path / "cli")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "cli").iterdir()) == before


def test_convert_cli_names_an_unsupported_model_type(tmp_path, capsys):
    from rlinf_jax.cli import convert as convert_cli

    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    assert convert_cli.main(["--from", str(tmp_path / "bert"), "--to", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model_type='bert' has no converter" in err[0] and "openvla" in err[0]
