"""Bad input of every kind is one ``error:`` line and exit code 2, never a traceback or an
unbounded wait: config files, data files, converter inputs. (Runs under faults are in
``test_failures.py``; checkpoint damage in ``test_runtime.py``.)"""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rlinf_jax.cli import convert as convert_cli
from rlinf_jax.cli import evaluate as evaluate_cli
from rlinf_jax.config import load_config
from rlinf_jax.data.datasets import load_prompt_dataset
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.convert.keys import Row, read_checkpoint
from rlinf_jax.policies.lm.tiny import save_tiny
from rlinf_jax.cli.train import main as train_main
from tests.test_compat import LEGACY


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err[-2000:]
    return err


# ------------------------------------------------------------------ configs

BILLION_LAUGHS = "a: &a [" + ",".join(['"lol"'] * 9) + "]\n" + "".join(
    f"{n}: &{n} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, n in zip("abcdefgh", "bcdefghi")
)


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(BILLION_LAUGHS)
    assert len(BILLION_LAUGHS) < 1000  # 9**9 = 387 million strings once expanded
    t0 = time.monotonic()
    assert train_main(["--config-name", str(path)]) == 2
    assert "expands to more than" in _error_line(capsys)
    assert time.monotonic() - t0 < 30  # it was minutes and gigabytes


@pytest.mark.parametrize(
    "text", ["a: &a\n  b: *a\n", "runner: " + "[" * 3000 + "]" * 3000 + "\n"], ids=["self-reference", "deep"]
)
def test_self_referencing_and_deeply_nested_yaml_are_refused(tmp_path, text):
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(BadInput, match="expands to more than|nested too deeply"):
        load_config(str(path))


def test_aliases_within_bounds_still_work(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("base: ppo_brax\nactor:\n  model:\n    policy_hidden_sizes: &h [16, 16]\n    value_hidden_sizes: *h\n")
    cfg = load_config(str(path))
    assert list(cfg.actor.model.value_hidden_sizes) == [16, 16]


def test_a_non_utf8_recipe_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("runner:\n  experiment_name: caf\xe9\n".encode("latin-1"))
    assert train_main(["--config-name", str(path)]) == 2
    assert "not UTF-8" in _error_line(capsys)


def test_a_non_utf8_run_config_is_one_error_line_for_evaluate(tmp_path, capsys):
    run = shutil.copytree(LEGACY / "embodied", tmp_path / "run")  # a real run with a checkpoint
    (run / "config.yaml").write_bytes(b"runner:\n  seed: \xff\xfe\n")
    assert evaluate_cli.main([str(run)]) == 2
    assert "not UTF-8" in _error_line(capsys)


# ------------------------------------------------------------------ data files


def test_deeply_nested_json_in_a_data_line_is_one_error(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "1+1", "answer": "2"}) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(BadInput, match=r"line 2: JSON nested too deeply"):
        load_prompt_dataset(path)


def test_an_answer_longer_than_pythons_int_limit_is_kept_as_text(tmp_path):
    digits = "7" * 5000
    path = tmp_path / "d.jsonl"
    path.write_text(f'{{"prompt": "how many?", "answer": {digits}}}\n')
    (rec,) = load_prompt_dataset(path).records
    assert rec["answer"] == digits


def test_a_prompt_longer_than_max_prompt_length_is_found_before_training(tmp_path, capsys):
    path = tmp_path / "train.jsonl"
    rows = [{"prompt": "1+1=?", "answer": "2", "id": f"p{i}"} for i in range(40)]
    rows[33] = {"prompt": "x" * 500, "answer": "3", "id": "the-long-one"}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from tests.test_sft import TINY_LM

    argv = ["--config-name", "sft_math", *TINY_LM, "data.source=files", f"data.train_path={path}",
            f"runner.output_dir={tmp_path / 'runs'}", "runner.max_steps=2", "data.max_prompt_length=64"]
    assert train_main(argv) == 2
    err = _error_line(capsys)
    assert "'the-long-one'" in err and "data.max_prompt_length=64" in err
    assert not (tmp_path / "runs").exists()  # refused before anything was written


# ------------------------------------------------------------------ convert


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    path, _ = save_tiny("qwen2", tmp_path_factory.mktemp("qwen2"))
    return path


def _copy_with(src, dst, config=None, edit=None):
    shutil.copytree(src, dst)
    if config is not None:
        (dst / "config.json").write_text(json.dumps(config))
    if edit is not None:
        tensors = load_file(dst / "model.safetensors")
        save_file(edit(tensors), dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _convert(capsys, src, out, *flags) -> tuple[int, str]:
    code = convert_cli.main(["--from", str(src), "--to", str(out), *flags])
    captured = capsys.readouterr()
    if code == 2:
        err = captured.err.strip()
        assert err.startswith("error: ") and "\n" not in err, err[-2000:]
        assert not out.exists()  # nothing written
        return code, err
    return code, captured.out


def _hf_config(src) -> dict:
    return json.loads((src / "config.json").read_text())


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda c: [c], "holds a JSON list"),
        (lambda c: {**c, "num_attention_heads": 0}, "num_attention_heads=0 must be an integer >= 1"),
        (lambda c: {**c, "hidden_size": "big"}, "hidden_size='big' must be an integer"),
        (lambda c: {**c, "num_hidden_layers": True}, "num_hidden_layers=True must be an integer"),
    ],
)
def test_convert_refuses_a_config_it_cannot_build(qwen2_dir, tmp_path, capsys, change, expected):
    src = _copy_with(qwen2_dir, tmp_path / "m", config=change(_hf_config(qwen2_dir)))
    code, err = _convert(capsys, src, tmp_path / "out")
    assert code == 2 and expected in err


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_convert_refuses_a_damaged_safetensors_file(qwen2_dir, tmp_path, capsys, damage):
    src = _copy_with(qwen2_dir, tmp_path / "m")
    file = src / "model.safetensors"
    raw = file.read_bytes()
    file.write_bytes({"truncated": raw[: len(raw) // 2], "garbage": b"\x13\x37" * 5000, "empty": b""}[damage])
    code, err = _convert(capsys, src, tmp_path / "out")
    assert code == 2 and "not a readable safetensors file" in err


def test_convert_refuses_shards_outside_the_model_directory(qwen2_dir, tmp_path, capsys):
    src = _copy_with(qwen2_dir, tmp_path / "m")
    tensors = load_file(src / "model.safetensors")
    (src / "model.safetensors").unlink()
    outside = tmp_path / "elsewhere.safetensors"
    save_file(tensors, outside, metadata={"format": "pt"})
    for name in ("../elsewhere.safetensors", str(outside)):
        index = {"metadata": {}, "weight_map": dict.fromkeys(tensors, name)}
        (src / "model.safetensors.index.json").write_text(json.dumps(index))
        code, err = _convert(capsys, src, tmp_path / "out")
        assert code == 2 and "lies outside" in err


@pytest.mark.parametrize("dtype", [np.int8, np.bool_, np.float64])
def test_convert_refuses_tensors_that_are_not_weights(qwen2_dir, tmp_path, capsys, dtype):
    key = "model.layers.0.mlp.up_proj.weight"
    src = _copy_with(qwen2_dir, tmp_path / "m", edit=lambda t: {**t, key: t[key].astype(dtype)})
    code, err = _convert(capsys, src, tmp_path / "out")
    assert code == 2 and key in err and "not as a weight" in err


def test_convert_refuses_nonfinite_weights_unless_told(qwen2_dir, tmp_path, capsys):
    key = "model.layers.1.self_attn.o_proj.weight"
    src = _copy_with(qwen2_dir, tmp_path / "m", edit=lambda t: {**t, key: np.full_like(t[key], np.nan)})
    code, err = _convert(capsys, src, tmp_path / "out")
    assert code == 2 and key in err and "non-finite" in err and "--allow-nonfinite" in err
    code, out = _convert(capsys, src, tmp_path / "out", "--allow-nonfinite")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["model_type"] == "qwen2"


def test_a_fused_tensor_that_does_not_split_evenly_is_refused_before_splitting(tmp_path):
    file = tmp_path / "model.safetensors"
    save_file({"blocks.0.attn.qkv.weight": np.ones((7, 4), np.float32)}, file)
    rows = [Row("blocks.{layer}.attn.qkv.weight", ("q.kernel", "k.kernel", "v.kernel"), "T")]
    targets = {name: np.zeros((4, 2), np.float32) for name in ("q.kernel", "k.kernel", "v.kernel")}
    with pytest.raises(BadInput, match=r"does not split evenly into 3 parts"):
        read_checkpoint([file], rows, (), targets, "vision tower")
