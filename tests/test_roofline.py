"""benchmarks/roofline.py: the FLOP count and rate every benchmark prints beside its ratio,
against a hand count (a jitted matrix product and a scan of known length)."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
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
