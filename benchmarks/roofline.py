"""FLOP/s beside each benchmark's ratio: how much of this machine our side's program uses.

A ratio against a peer says who is faster, not whether either is near what the machine
can do. Each benchmark therefore also reports its JAX program's achieved FLOP/s and the
share of the machine's float32 matrix-product peak, measured through XLA in the same
process (the best of square products up to 1024 wide, each alone and one per core side by
side: `rlinf_jax.profile.matmul_peak`; a benchmark pinned to one core gets a one-core
peak) or given with ``--peak-gflops``.

FLOPs are counted on the program's jaxpr by ``rlinf_jax.profile.count_flops``: 2*M*N*K
per matrix product, none for ops that only move data, one per output element of every
other op, scans times their length, while loops times ``while_trips`` (a traced trip
count is invisible to the jaxpr), conds their costliest branch. It is the program's arithmetic, not what XLA fuses or skips.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math

PEAK_SIZE = 1024  # the largest product: 2 GFLOP, a fraction of a second per run on one CPU core
PEAK_REPEATS = 5


def add_peak_argument(parser) -> None:
    parser.add_argument("--peak-gflops", type=float,
                        help="the float32 matmul peak to measure FLOP/s against (default: measured here "
                             f"through XLA, the best of products up to {PEAK_SIZE}^2, medians of {PEAK_REPEATS})")


@functools.lru_cache(maxsize=None)
def peak_flops_per_s(gflops: float | None = None) -> float:
    """The float32 matrix-product peak, FLOP/s: ``gflops`` when given, else measured once."""
    if gflops:
        return gflops * 1e9
    from rlinf_jax.profile import matmul_peak

    return matmul_peak(PEAK_SIZE, PEAK_REPEATS, "float32")


def program_flops(fn, *args, while_trips: int = 1) -> float:
    """FLOPs of one call of ``fn(*args)`` (jitted or not), counted on its jaxpr."""
    import jax

    from rlinf_jax.profile import count_flops

    return count_flops(jax.make_jaxpr(fn)(*args).jaxpr, while_trips)


def rate(flops: float, seconds: float, peak: float) -> dict:
    """Achieved FLOP/s of ``flops`` done in ``seconds`` and its share of ``peak``."""
    flop_per_s = flops / seconds if seconds else None
    return {"flops": flops, "flop_per_s": flop_per_s,
            "share_of_peak": flop_per_s / peak if flop_per_s is not None else None}


def achieved(fn, args, seconds: float, peak: float, while_trips: int = 1) -> dict:
    """``rate`` of one call of ``fn(*args)`` that took ``seconds``."""
    return rate(program_flops(fn, *args, while_trips=while_trips), seconds, peak)


def result_keys(r: dict, peak: float, side: str = "ours") -> dict:
    """The keys a benchmark adds to its JSON result (new keys only: existing ones stay)."""
    return {f"{side}_flops": r["flops"], f"{side}_flops_per_s": _round(r["flop_per_s"]),
            f"{side}_share_of_peak": _round(r["share_of_peak"]), "peak_flops_per_s": _round(peak)}


def line(label: str, r: dict, peak: float) -> str:
    """One human-readable line: achieved FLOP/s and share of the peak."""
    if r["flop_per_s"] is None:
        return f"{label}: {r['flops'] / 1e9:.3g} GFLOP, not timed"
    return (f"{label}: {r['flop_per_s'] / 1e9:,.2f} GFLOP/s = {r['share_of_peak']:.1%} of the measured float32 "
            f"XLA matmul peak ({peak / 1e9:,.1f} GFLOP/s)")


def _round(x):
    return None if x is None else float(f"{x:.4g}")


@contextlib.contextmanager
def counting_calls(module, while_trips: dict):
    """For a side that is a host loop over jitted programs: while inside, every call of
    ``module.<name>`` (a module-level jitted function, looked up at call time) for each
    ``name`` of ``while_trips`` adds its FLOPs (its while loops times ``while_trips[name]``,
    a number or a function of the call's output) to the yielded dict's ``"flops"``. ``module``
    may be an object: its attribute is replaced the same way. It traces every call again: use it on an untimed run."""
    import jax

    from rlinf_jax.profile import count_flops

    total = {"flops": 0.0, "calls": 0}
    originals = {name: getattr(module, name) for name in while_trips}

    def counted(fn, trips):
        def call(*args, **kwargs):
            # The arguments enter as constants: static ones stay static for fn's own jit.
            # Traced before the call: the call may donate its arguments.
            jaxpr = jax.make_jaxpr(lambda: fn(*args, **kwargs))().jaxpr
            out = fn(*args, **kwargs)
            total["flops"] += count_flops(jaxpr, trips(out) if callable(trips) else trips)
            total["calls"] += 1
            return out

        return call

    for name, fn in originals.items():
        setattr(module, name, counted(fn, while_trips[name]))
    try:
        yield total
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)


# ------------------------------------------------------------ products one by one
def collect_dots(jaxpr, mult: int = 1, out=None) -> collections.Counter:
    """``(lhs shape, rhs shape, contracting dims, batch dims) -> how many times it runs``
    for every matrix product of a jaxpr, scans counted ``length`` times."""
    from rlinf_jax.profile import _sub_jaxprs

    out = collections.Counter() if out is None else out
    for eqn in jaxpr.eqns:
        name, params = eqn.primitive.name, eqn.params
        if name == "dot_general":
            (lc, rc), (lb, rb) = params["dimension_numbers"]
            key = (eqn.invars[0].aval.shape, eqn.invars[1].aval.shape, (tuple(lc), tuple(rc)), (tuple(lb), tuple(rb)))
            out[key] += mult
        elif name == "scan":
            collect_dots(params["jaxpr"].jaxpr, mult * params["length"], out)
        else:
            for sub in _sub_jaxprs(params):
                collect_dots(sub, mult, out)
    return out


def dot_flops(key) -> float:
    """2 x (batch x lhs free x rhs free) x contracted, of one product."""
    lhs, rhs, (lc, rc), (lb, rb) = key
    lfree = [n for i, n in enumerate(lhs) if i not in lc and i not in lb]
    rfree = [n for j, n in enumerate(rhs) if j not in rc and j not in rb]
    return 2.0 * math.prod(lhs[i] for i in lb) * math.prod(lfree) * math.prod(rfree) * math.prod(lhs[i] for i in lc)


def einsum_spec(key) -> str:
    """The torch.einsum subscripts of a dot_general (batch, lhs free, rhs free: its output order)."""
    lhs, rhs, (lc, rc), (lb, rb) = key
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    left, right = [None] * len(lhs), [None] * len(rhs)
    batch = []
    for i, j in zip(lb, rb):
        left[i] = right[j] = c = next(letters)
        batch.append(c)
    for i, j in zip(lc, rc):
        left[i] = right[j] = next(letters)
    free = []
    for axes in (left, right):
        for i, letter in enumerate(axes):
            if letter is None:
                axes[i] = next(letters)
                free.append(axes[i])
    return f"{''.join(left)},{''.join(right)}->{''.join(batch + free)}"
