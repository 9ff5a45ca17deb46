"""runner.xla_cpu_flags: which flags a run adds to XLA_FLAGS, that the command line and the
API put them there before JAX starts, and that the project's CPU defaults compute what
plain XLA computes (each side in its own process: XLA reads its flags once)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, clean_env, run_cli

from rlinf_jax.runtime import xla_flags
from rlinf_jax.runtime.xla_flags import CPU_DEFAULT_FLAGS, DEFAULT, apply_xla_cpu_flags, merged_flags, resolve

# A real flag that changes nothing a test can see, so that the application is checked even
# when the project's defaults are empty.
PROBE = "--xla_cpu_enable_fast_min_max=false"
YNN_DOT = "--xla_cpu_experimental_ynn_fusion_type=dot"


def test_resolve_and_merge():
    assert resolve(DEFAULT) == CPU_DEFAULT_FLAGS
    assert resolve("") == ""
    assert resolve(" --a=1 ") == "--a=1"
    assert merged_flags("--a=1 --b=2", "") == "--a=1 --b=2"
    # A flag the user's XLA_FLAGS sets wins; the others are added after the user's.
    assert merged_flags("--a=1 --b=2", "--b=7 --xla_force_host_platform_device_count=2") == (
        "--b=7 --xla_force_host_platform_device_count=2 --a=1"
    )
    assert merged_flags("", "--b=7") == "--b=7"


def test_apply_only_on_cpu_and_only_what_is_missing(monkeypatch):
    monkeypatch.setattr(xla_flags, "_backend_started", lambda: False)
    env = {"JAX_PLATFORMS": "cuda"}
    assert apply_xla_cpu_flags(PROBE, env) is None and "XLA_FLAGS" not in env
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert apply_xla_cpu_flags(PROBE, env) == f"--xla_force_host_platform_device_count=2 {PROBE}"
    assert apply_xla_cpu_flags(PROBE, env) is None  # already there: nothing changes
    env = {"JAX_PLATFORMS": "cpu"}
    assert apply_xla_cpu_flags("", env) is None and "XLA_FLAGS" not in env


def test_started_backend_is_left_alone_with_one_warning(monkeypatch, capsys):
    monkeypatch.setattr(xla_flags, "_backend_started", lambda: True)
    monkeypatch.setattr(xla_flags, "_warned", False)
    env = {"JAX_PLATFORMS": "cpu"}
    assert apply_xla_cpu_flags(PROBE, env) is None and "XLA_FLAGS" not in env
    assert apply_xla_cpu_flags(PROBE, env) is None
    err = capsys.readouterr().err
    assert err.count("warning: runner.xla_cpu_flags") == 1


def _python(code: str, **env) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=clean_env(JAX_PLATFORMS="cpu", **env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_api_sets_the_flags_before_jax_starts():
    out = _python(
        "import os, rlinf_jax as rj\n"
        f"rj.load_config('ppo_brax', {{'runner.xla_cpu_flags': '{PROBE}'}})\n"
        "import jax, jax.numpy as jnp\n"
        "print(os.environ.get('XLA_FLAGS', ''), float(jnp.ones(3).sum()))\n",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
    )
    assert out.split() == ["--xla_force_host_platform_device_count=2", PROBE, "3.0"]


@pytest.mark.slow
def test_cli_run_records_its_flags(tmp_path, tiny):
    args = [*tiny, "runner.max_steps=1", "runner.eval_interval=0", "runner.save_interval=0", "runner.tensorboard=false"]
    proc = run_cli([*args, f"runner.xla_cpu_flags={PROBE}"], env_extra={"XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "t" / "placement.json").read_text())["xla_flags"] == PROBE


LM_STEP = """
import json, sys
import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from rlinf_jax.policies.lm import CausalLM, LMConfig
cfg = LMConfig(model_type="qwen2", vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2,
               num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=True, attention_bias=True)
graphdef, params = nnx.split(CausalLM(cfg, rngs=nnx.Rngs(0)))
ids = jnp.asarray(np.random.default_rng(0).integers(0, 512, (8, 64)), jnp.int32)
tx = optax.adamw(3e-4)
def loss_fn(p, ids):
    logp = jax.nn.log_softmax(nnx.merge(graphdef, p)(ids)[:, :-1], axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))
@jax.jit
def step(p, o, ids):
    loss, g = jax.value_and_grad(loss_fn)(p, ids)
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), o, loss
o = tx.init(params)
losses = []
for _ in range(3):
    params, o, loss = step(params, o, ids)
    losses.append(float(loss))
print(json.dumps(losses))
"""


@pytest.mark.slow
def test_cpu_default_flags_compute_what_plain_xla_computes(tmp_path, tiny):
    """The project's defaults against no flags: an LM train step's losses and a PPO run's
    metrics agree to float tolerance (each in its own process)."""
    prepare = "from rlinf_jax.api import prepare_jax; prepare_jax(None, {})\n"
    # The defaults, and the dot fusion the CPU benchmark tried first, against plain XLA.
    lm = {s: json.loads(_python(prepare.format([f"runner.xla_cpu_flags={s}"]) + LM_STEP, XLA_FLAGS=""))
          for s in (DEFAULT, YNN_DOT, "")}
    np.testing.assert_allclose(lm[DEFAULT], lm[""], rtol=1e-5)
    np.testing.assert_allclose(lm[YNN_DOT], lm[""], rtol=1e-5)

    base = [*tiny, "runner.max_steps=3", "runner.log_interval=1", "runner.eval_interval=0", "runner.save_interval=0",
            "runner.tensorboard=false"]
    metrics = {}
    for name, setting in (("default", DEFAULT), ("plain", "")):
        # '' on the command line: a bare `key=` is YAML's null.
        proc = run_cli([*base, f"runner.experiment_name={name}", f"runner.xla_cpu_flags='{setting}'"],
                       env_extra={"XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        flags = json.loads((tmp_path / name / "placement.json").read_text())["xla_flags"]
        assert flags == (CPU_DEFAULT_FLAGS if setting == DEFAULT else "")
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        metrics[name] = {(row["step"], k): v for row in rows for k, v in row.items()
                         if isinstance(v, float) and k.startswith(("train/", "env/"))}
    assert metrics["default"].keys() == metrics["plain"].keys() and metrics["plain"]
    for k in metrics["plain"]:
        np.testing.assert_allclose(metrics["default"][k], metrics["plain"][k], rtol=1e-3, atol=1e-5, err_msg=str(k))
