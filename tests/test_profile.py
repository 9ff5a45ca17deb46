"""python -m rlinf_jax.profile: its FLOP count against hand-computed ones and XLA's cost
analysis, and one run of the command on the language-model workload."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from conftest import ROOT, clean_env

from rlinf_jax.profile import count_flops


def test_count_flops_by_hand():
    a, b = jnp.ones((8, 16)), jnp.ones((16, 4))
    # 2*M*N*K for the product, one per output element for tanh.
    assert count_flops(jax.make_jaxpr(lambda a, b: jnp.tanh(a @ b))(a, b).jaxpr) == 2 * 8 * 16 * 4 + 8 * 4
    c = jnp.ones((4, 4))

    def scanned(c):
        return jax.lax.scan(lambda x, _: (x @ c, None), c, None, length=5)[0]

    assert count_flops(jax.make_jaxpr(scanned)(c).jaxpr) == 5 * 2 * 4 * 4 * 4
    looped = jax.make_jaxpr(lambda c, n: jax.lax.fori_loop(0, n, lambda i, x: x @ c, c))(c, 3).jaxpr
    body = 2 * 4 * 4 * 4
    assert count_flops(looped, while_trips=7) >= 7 * body  # the loop counter's adds come on top
    assert count_flops(looped, while_trips=7) < 8 * body


def test_count_flops_agrees_with_xla_without_loops():
    """XLA's cost analysis is exact on a program without loops: a two-layer MLP's forward,
    backward and SGD step."""
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(0), 4)
    w1, w2 = jax.random.normal(k1, (64, 128)), jax.random.normal(k2, (128, 32))
    x, y = jax.random.normal(k3, (256, 64)), jax.random.normal(k4, (256, 32))

    def step(w1, w2, x, y):
        loss = lambda w: jnp.mean((jnp.tanh(x @ w[0]) @ w[1] - y) ** 2)  # noqa: E731
        g = jax.grad(loss)((w1, w2))
        return w1 - 0.1 * g[0], w2 - 0.1 * g[1]

    ours = count_flops(jax.make_jaxpr(step)(w1, w2, x, y).jaxpr)
    cost = jax.jit(step).lower(w1, w2, x, y).compile().cost_analysis()
    xla = (cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"]
    # Forward: two products; backward: both weight gradients and the hidden layer's
    # (the input's is not asked for).
    matmuls = 2 * (2 * 256 * 64 * 128 + 3 * 256 * 128 * 32)
    assert abs(ours - xla) / xla < 0.05
    assert matmuls <= ours < 1.1 * matmuls


def test_the_peak_is_the_fastest_product_and_a_stage_of_it_is_all_of_it(monkeypatch):
    """The peak and the stages are measured alike: a stage that is the peak's own product,
    timed as the peak timed it, is 100% of the peak, never more. A CPU whose 512-wide
    products, two side by side, run faster than one 2048-wide product (a 2-core AMD EPYC
    does) gets that as its peak; from the 2048-wide product alone the same stage read 200%."""
    import numpy as np

    from rlinf_jax import profile

    rates = {(256, 1): 30e9, (256, 2): 40e9, (512, 1): 60e9, (512, 2): 90e9,
             (1024, 1): 50e9, (1024, 2): 70e9, (2048, 1): 45e9, (2048, 2): 60e9}

    def timed(fn, args, repeats):  # this machine's times, by the products' shape
        parallel, n, _ = args[0].shape
        return parallel * 2 * n**3 / rates[(n, parallel)]

    monkeypatch.setattr(profile, "_timed", timed)
    monkeypatch.setattr(profile, "cores", lambda: 2)
    assert profile.matmul_rates(2048, 1) == {f"{n}x{p}": r for (n, p), r in rates.items()}
    by_size = profile.matmul_rates(2048, 1)
    peaks = {"platform": "cpu", "peak_float32": max(by_size.values()), "xla_bandwidth": 1e10,
             "xla_matmul_float32_by_size": by_size}
    assert peaks["peak_float32"] == profile.matmul_peak(2048, 1) == 90e9
    # Timed again beside a stage: a faster reading (less load now) raises the stage's peak.
    assert profile.stage_peak(peaks) == profile.stage_peak(peaks, repeats=1) == 90e9
    rates[(512, 2)] = 99e9
    assert profile.stage_peak(peaks, repeats=1) == 99e9 and peaks["peak_float32"] == 90e9
    rates[(512, 2)] = 90e9
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 512, 512)), jnp.float32)
    record, _ = profile.stage("two products", lambda x: [x[0] @ x[0], x[1] @ x[1]], (x,), peaks, repeats=1)
    assert record["flops"] == 2 * 2 * 512**3 and record["peak_flop_per_s"] == 90e9
    assert record["share_of_peak"] == pytest.approx(1.0)


@pytest.mark.slow
def test_profile_command_on_the_language_model():
    proc = subprocess.run(
        [sys.executable, "-m", "rlinf_jax.profile", "--workloads", "grpo", "--repeats", "1", "--matmul-size", "256"],
        capture_output=True, text=True, cwd=ROOT, timeout=900, env=clean_env(JAX_PLATFORMS="cpu"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    peaks = out["peaks"]
    assert peaks["xla_matmul_float32"] > 0 and peaks["xla_bandwidth"] > 0
    # The peak is the best product measured, XLA's at every size or torch's.
    assert peaks["xla_matmul_float32"] == max(peaks["xla_matmul_float32_by_size"].values())
    assert peaks["peak_float32"] == max(peaks["xla_matmul_float32"], peaks.get("torch_matmul_float32", 0.0))
    stages = {s["stage"]: s for s in out["stages"]}
    for s in stages.values():
        assert s["peak_flop_per_s"] >= peaks["peak_float32"]
        assert s["share_of_peak"] == pytest.approx(s["flop_per_s"] / s["peak_flop_per_s"])
    assert set(stages) == {"grpo/sampler_prefill", "grpo/sampler_decode", "grpo/update"}
    for s in stages.values():
        assert s["flops"] > 0 and 0 < s["share_of_peak"] and s["bound"] in ("compute", "memory", "dispatch")
    # Prefill and update have no loops: the jaxpr count is XLA's.
    for name in ("grpo/sampler_prefill", "grpo/update"):
        assert abs(stages[name]["flops"] - stages[name]["xla_flops"]) / stages[name]["xla_flops"] < 0.05
    # Decode is a loop XLA counts once: 63 steps after the prefill's token.
    assert stages["grpo/sampler_decode"]["flops"] > 50 * stages["grpo/sampler_decode"]["xla_flops"]


@pytest.mark.slow
def test_profile_command_on_the_vla():
    """The tiny VLA's PPO rollout (a scan over the tabletop's steps) and update, placed
    against the peaks."""
    proc = subprocess.run(
        [sys.executable, "-m", "rlinf_jax.profile", "--workloads", "vla", "--repeats", "1", "--matmul-size", "256",
         "env.num_envs=8", "algorithm.rollout_length=2"],
        capture_output=True, text=True, cwd=ROOT, timeout=900, env=clean_env(JAX_PLATFORMS="cpu"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stages = {s["stage"]: s for s in json.loads(proc.stdout.strip().splitlines()[-1])["stages"]}
    assert set(stages) == {"vla/rollout", "vla/update"}
    for s in stages.values():
        assert s["flops"] > 0 and 0 < s["share_of_peak"] and s["bound"] in ("compute", "memory", "dispatch")
    # The update scans over the recipe's 2 minibatches, a loop whose body XLA counts once:
    # ours is A + 2B where XLA's is A + B.
    update = stages["vla/update"]
    assert update["xla_flops"] < update["flops"] <= 2 * update["xla_flops"]


def test_bad_workload_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "rlinf_jax.profile", "--workloads", "nope"], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env=clean_env(JAX_PLATFORMS="cpu"))
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: unknown workload nope")
