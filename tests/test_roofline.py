"""benchmarks/roofline.py: the FLOP count and rate every benchmark prints beside its ratio,
against a hand count (a jitted matrix product and a scan of known length)."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import roofline  # noqa: E402


def test_flops_of_a_jitted_product_and_a_scan():
    a, b, c = jnp.ones((32, 64)), jnp.ones((64, 16)), jnp.ones((16, 16))

    @jax.jit
    def program(a, b, c):
        h = a @ b  # 2*32*64*16
        return jax.lax.scan(lambda x, _: (x @ c, None), h, None, length=6)[0]  # 6 * 2*32*16*16

    flops = 2 * 32 * 64 * 16 + 6 * 2 * 32 * 16 * 16
    assert roofline.program_flops(program, a, b, c) == flops
    r = roofline.achieved(program, (a, b, c), seconds=0.5, peak=4 * flops)
    assert r == {"flops": flops, "flop_per_s": 2 * flops, "share_of_peak": 0.5}
    keys = roofline.result_keys(r, peak=4 * flops)
    assert keys["ours_flops_per_s"] == float(f"{2 * flops:.4g}") and keys["ours_share_of_peak"] == 0.5
    assert "50.0% of the measured float32" in roofline.line("ours", r, 4 * flops)


def test_peak_given_is_not_measured():
    assert roofline.peak_flops_per_s(123.0) == 123e9


def test_products_one_by_one_against_the_jaxpr_count_and_torch():
    """`dot_gap.py`'s helpers: every product of a program with its multiplicity, its FLOPs
    (equal to count_flops on a program of products only) and torch.einsum subscripts that
    compute what dot_general computes."""
    torch = pytest.importorskip("torch")
    a, w = jnp.ones((4, 6, 8)), jnp.ones((8, 5))

    def program(a, w):
        h = a @ w  # [4, 6, 5]
        s = jnp.einsum("bqd,bkd->bqk", h, h)  # a batched product
        return jax.lax.scan(lambda x, _: (x @ jnp.ones((5, 5)), None), h, None, length=3)[0], s

    jaxpr = jax.make_jaxpr(program)(a, w).jaxpr
    dots = roofline.collect_dots(jaxpr)
    assert sum(dots.values()) == 5 and max(dots.values()) == 3  # the scan's product thrice
    assert sum(roofline.dot_flops(k) * n for k, n in dots.items()) == 2 * (4 * 6 * 8 * 5 + 4 * 6 * 6 * 5 + 3 * 4 * 6 * 5 * 5)
    # A weight gradient contracts the rows: dimension numbers other than a plain product's.
    grads = roofline.collect_dots(jax.make_jaxpr(jax.grad(lambda w: jnp.sum(jnp.tanh(a @ w))))(w).jaxpr)
    assert any(key[2][0] != (len(key[0]) - 1,) for key in grads)
    rng = np.random.default_rng(0)
    for key in [*dots, *grads]:
        lhs, rhs, contract, batch = key
        x, y = rng.standard_normal(lhs, np.float32), rng.standard_normal(rhs, np.float32)
        want = jax.lax.dot_general(x, y, (contract, batch))
        got = torch.einsum(roofline.einsum_spec(key), torch.from_numpy(x), torch.from_numpy(y)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
