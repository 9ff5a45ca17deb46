"""Loading Hugging Face checkpoints: strict key mapping, sharded files, config layouts,
converted Orbax directories and the ``python -m rlinf_jax.convert`` CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.numpy import load_file, save_file

from rlinf_jax.cli import convert as convert_cli
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import from_pretrained, load_converted
from rlinf_jax.policies.lm import LMConfig
from rlinf_jax.policies.lm.tiny import save_tiny

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    path, _ = save_tiny("qwen2", tmp_path_factory.mktemp("qwen2"))
    return path


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    path, _ = save_tiny("llama", tmp_path_factory.mktemp("llama"))
    return path


def edited_copy(src, dst, edit):
    """Copy a checkpoint directory, passing its tensors through ``edit(dict) -> dict``."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    save_file(edit(tensors), dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def logits_of(model, seed=0):
    ids = jnp.asarray(np.random.default_rng(seed).integers(0, 97, (2, 6)))
    return np.asarray(model(ids))


def test_missing_key_is_named(qwen2_dir, tmp_path):
    key = "model.layers.1.mlp.up_proj.weight"
    d = edited_copy(qwen2_dir, tmp_path / "m", lambda t: {k: v for k, v in t.items() if k != key})
    with pytest.raises(BadInput, match=key.replace(".", r"\.")):
        from_pretrained(d)


def test_unexpected_key_is_named(qwen2_dir, tmp_path):
    key = "model.layers.0.self_attn.o_proj.bias"  # Qwen2 has no o_proj bias
    d = edited_copy(qwen2_dir, tmp_path / "u", lambda t: {**t, key: np.zeros(60, np.float32)})
    with pytest.raises(BadInput, match=key.replace(".", r"\.")):
        from_pretrained(d)
    key = "model.visual.patch_embed.weight"  # matches no row at all
    d = edited_copy(qwen2_dir, tmp_path / "u2", lambda t: {**t, key: np.zeros(3, np.float32)})
    with pytest.raises(BadInput, match=key.replace(".", r"\.")):
        from_pretrained(d)


def test_shape_mismatch_names_key_and_both_shapes(qwen2_dir, tmp_path):
    key = "model.layers.0.self_attn.k_proj.weight"
    d = edited_copy(qwen2_dir, tmp_path / "s", lambda t: {**t, key: np.zeros((30, 60), np.float32)})
    with pytest.raises(BadInput) as err:
        from_pretrained(d)
    msg = str(err.value)
    assert key in msg and "(30, 60)" in msg and "(20, 60)" in msg


def test_unknown_model_type_lists_supported(qwen2_dir, tmp_path):
    d = shutil.copytree(qwen2_dir, tmp_path / "t")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(BadInput, match="gpt2.*llama, qwen2, qwen3"):
        from_pretrained(d)


def test_missing_files_are_bad_input(qwen2_dir, tmp_path):
    with pytest.raises(BadInput, match="not a directory"):
        from_pretrained(tmp_path / "absent")
    d = shutil.copytree(qwen2_dir, tmp_path / "noweights")
    (d / "model.safetensors").unlink()
    with pytest.raises(BadInput, match="model.safetensors"):
        from_pretrained(d)
    (d / "config.json").unlink()
    with pytest.raises(BadInput, match="config.json"):
        from_pretrained(d)


def test_ignored_buffers_and_duplicate_tied_head_load(qwen2_dir, tmp_path):
    def add(t):
        extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(5, np.float32)}
        return {**t, **extra, "lm_head.weight": t["model.embed_tokens.weight"]}

    d = edited_copy(qwen2_dir, tmp_path / "i", add)
    np.testing.assert_array_equal(logits_of(from_pretrained(d)), logits_of(from_pretrained(qwen2_dir)))


def test_sharded_index_loads_like_single_file(llama_dir, tmp_path):
    d = tmp_path / "sharded"
    d.mkdir()
    shutil.copy(llama_dir / "config.json", d)
    tensors = load_file(llama_dir / "model.safetensors")
    keys = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    weight_map = {}
    for name, part in shards.items():
        save_file({k: tensors[k] for k in part}, d / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    np.testing.assert_array_equal(logits_of(from_pretrained(d)), logits_of(from_pretrained(llama_dir)))
    # transformers reads the same sharded directory: an independent check of the layout.
    assert transformers.AutoModelForCausalLM.from_pretrained(d).config.model_type == "llama"


def test_transformers4_config_layout_gives_the_same_rope(llama_dir):
    new = json.loads((llama_dir / "config.json").read_text())
    old = {k: v for k, v in new.items() if k != "rope_parameters"}
    rope = dict(new["rope_parameters"])
    old["rope_theta"] = rope.pop("rope_theta")
    old["rope_scaling"] = {"type" if k == "rope_type" else k: v for k, v in rope.items()}
    a, b = LMConfig.from_hf_config(new), LMConfig.from_hf_config(old)
    assert a.rope == b.rope and a.rope.kind == "llama3" and a.rope.theta == 500.0
    # Reference: transformers' own rotary embedding built from the old layout.
    hf_cfg = transformers.LlamaConfig.from_dict(old)
    ref = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(hf_cfg).inv_freq.numpy()
    np.testing.assert_allclose(b.rope.inv_freq(b.head_dim), ref, rtol=1e-6)


def test_config_defaults_and_switches():
    base = {"vocab_size": 11, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 1, "num_attention_heads": 4}
    llama = LMConfig.from_hf_config({**base, "model_type": "llama"})
    assert (llama.head_dim, llama.num_kv_heads, llama.rope.theta, llama.attention_bias) == (8, 4, 10_000.0, False)
    qwen2 = LMConfig.from_hf_config({**base, "model_type": "qwen2", "tie_word_embeddings": True})
    assert qwen2.attention_bias and not qwen2.o_proj_bias and qwen2.tie_word_embeddings
    qwen3 = LMConfig.from_hf_config({**base, "model_type": "qwen3"})
    assert qwen3.qk_norm and qwen3.head_dim == 128  # transformers' Qwen3 default
    with pytest.raises(BadInput, match="sliding"):
        LMConfig.from_hf_config({**base, "model_type": "qwen2", "use_sliding_window": True})
    with pytest.raises(BadInput, match="yarn"):
        LMConfig.from_hf_config({**base, "model_type": "llama", "rope_parameters": {"rope_type": "yarn"}})
    with pytest.raises(BadInput, match="num_key_value_heads"):
        LMConfig.from_hf_config({**base, "model_type": "llama", "num_key_value_heads": 3})


def test_shardings_place_each_parameter(qwen2_dir):
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    model = from_pretrained(qwen2_dir, shardings=replicated)
    leaves = jax.tree.leaves(model)
    assert leaves and all(x.sharding == replicated for x in leaves)
    by_rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    tree = {"embed": {"embedding": by_rows}}
    model = from_pretrained(qwen2_dir, shardings=tree)
    assert model.embed.embedding[...].sharding == by_rows
    with pytest.raises(BadInput, match="lm_head"):
        from_pretrained(qwen2_dir, shardings={"lm_head": {"kernel": by_rows}})  # tied: no head


def test_convert_then_load_converted(llama_dir, tmp_path, capsys):
    out = tmp_path / "conv"
    assert convert_cli.main(["--from", str(llama_dir), "--to", str(out), "--dtype", "bfloat16"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["model_type"] == "llama" and summary["dtype"] == "bfloat16"
    assert json.loads((out / "config.json").read_text()) == json.loads((llama_dir / "config.json").read_text())
    restored = load_converted(out)
    direct = from_pretrained(llama_dir, dtype=jnp.bfloat16)
    assert summary["params"] == sum(x.size for x in jax.tree.leaves(direct))
    np.testing.assert_array_equal(logits_of(restored), logits_of(direct))
    # Refuses to write into a non-empty directory.
    assert convert_cli.main(["--from", str(llama_dir), "--to", str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_convert_cli_bad_input_exits_2(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    for src in (tmp_path / "absent", tmp_path / "empty"):
        r = subprocess.run(
            [sys.executable, "-m", "rlinf_jax.convert", "--from", str(src), "--to", str(tmp_path / "out")],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "out").exists()


def test_scanned_layout_from_hf_and_converted_directories(llama_dir, tmp_path):
    """Both sources load into the scanned layout with the unrolled model's numbers; a
    sharding given for a stacked parameter places the whole stack."""
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    by_embed = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "data"))
    tree = {"layers": {"mlp": {"up_proj": {"kernel": by_embed}}}}
    unrolled = from_pretrained(llama_dir)
    scanned = from_pretrained(llama_dir, shardings=tree, scan_layers=True)
    kernel = scanned.layers.mlp.up_proj.kernel[...]
    assert kernel.shape == (2, 60, 88) and kernel.sharding == by_embed
    np.testing.assert_array_equal(kernel[1], unrolled.layers[1].mlp.up_proj.kernel[...])
    np.testing.assert_allclose(logits_of(scanned), logits_of(unrolled), rtol=2e-5, atol=1e-5)  # logits ~3
    assert convert_cli.main(["--from", str(llama_dir), "--to", str(tmp_path / "conv")]) == 0
    converted = load_converted(tmp_path / "conv", shardings=tree, scan_layers=True)
    assert converted.scan_layers and converted.layers.mlp.up_proj.kernel[...].sharding == by_embed
    np.testing.assert_array_equal(logits_of(converted), logits_of(scanned))
    with pytest.raises(BadInput, match="layers.0.mlp"):
        from_pretrained(llama_dir, shardings={"layers": {0: {"mlp": {"up_proj": {"kernel": by_embed}}}}},
                        scan_layers=True)
