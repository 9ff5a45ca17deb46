"""What the benchmarks against Brax share: the compatibility shim brax 0.14.2 needs on
current JAX, a clock of JAX's compile time, and the summary of a training run's evaluations
and epochs (steady throughput, time and env steps to a return threshold)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

BRAX_PMAP_AXIS = "i"

COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


def _install_device_put_replicated_shim(jax) -> bool:
    """brax 0.14.2 calls ``jax.device_put_replicated``, removed in JAX 0.10.

    The removed API returned, for each leaf ``x``, an array of shape
    ``(len(devices), *x.shape)`` holding a copy of ``x`` in every slice, sharded one slice
    per device (a ``NamedSharding`` over a 1-D mesh of ``devices``), usable as a
    ``jax.pmap`` input. This is the same thing from public APIs (the JAX pmap migration
    guide's drop-in replacement). Returns whether the shim was installed.

    The mesh axis is named ``"i"``, Brax's pmap axis name: under the jit/shard_map based
    ``jax.pmap`` the outputs of Brax's pmapped functions carry a ``NamedSharding`` over a
    mesh with that axis, and a sharding is part of every jit cache key. With any other
    name (JAX's own removed implementation used ``"_device_put_replicated"``) the training
    state changes sharding after the first epoch, and Brax recompiled its training epoch
    a second time and its evaluation at every single eval (measured: ~10 s per eval on
    inverted_pendulum). Naming it ``"i"`` leaves Brax with one compile per program, apart
    from one evaluation recompile that is Brax's own (its donated eval state starts on a
    single device and comes back on the mesh).
    """
    try:
        jax.device_put_replicated  # noqa: B018
        return False
    except AttributeError:
        pass
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    def device_put_replicated(x, devices):
        devices = list(devices)
        if not devices:
            raise ValueError("device_put_replicated needs a non-empty sequence of devices")
        sharding = NamedSharding(Mesh(np.array(devices), (BRAX_PMAP_AXIS,)), P(BRAX_PMAP_AXIS))

        def put(leaf):
            leaf = jnp.asarray(leaf)
            return jax.device_put(jnp.broadcast_to(leaf[None], (len(devices), *leaf.shape)), sharding)

        return jax.tree.map(put, x)

    jax.device_put_replicated = device_put_replicated
    return True


class CompileClock:
    """Sums JAX's compile-phase monitoring events (trace, lower, XLA compile) while active.

    The events fire once per top-level jit/pmap compile (tracing of nested jits inside a
    trace is not reported separately), so nothing is counted twice.
    """

    def __init__(self, jax):
        self.active = False
        self.by_phase: dict[str, float] = {}
        self.by_fun: dict[str, float] = {}
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, fun_name=None, **_):
        if self.active and event in COMPILE_EVENTS:
            phase = event.rsplit("/", 1)[-1]
            self.by_phase[phase] = self.by_phase.get(phase, 0.0) + duration
            name = str(fun_name or "?")
            self.by_fun[name] = self.by_fun.get(name, 0.0) + duration

    def start(self):
        self.by_phase = {e.rsplit("/", 1)[-1]: 0.0 for e in COMPILE_EVENTS}
        self.by_fun = {}
        self.active = True

    def total(self) -> float:
        return sum(self.by_phase.values())

    def stop(self) -> dict:
        self.active = False
        top = sorted(self.by_fun.items(), key=lambda kv: -kv[1])[:6]
        return {
            "total": round(self.total(), 3),
            **{k: round(v, 3) for k, v in self.by_phase.items()},
            "top_functions": {k: round(v, 2) for k, v in top},
        }


def log(msg: str) -> None:
    print(msg, flush=True)


def _first_reach(evals: list[dict], threshold: float):
    for e in evals:
        if e["eval_return"] >= threshold:
            return e
    return None


def _summary(name, evals, epochs, compile_info, threshold, total_wall, extra=None) -> dict:
    """`epochs`: [(env_steps, seconds)] of each training epoch/chunk, in order."""
    steady = epochs[1:]
    steady_steps = sum(s for s, _ in steady)
    steady_sec = sum(t for _, t in steady)
    hit = _first_reach(evals, threshold)
    out = {
        "steady_steps_per_sec": round(steady_steps / steady_sec, 1) if steady_sec > 0 else None,
        "steady_steps_per_sec_median_epoch": round(statistics.median(s / t for s, t in steady), 1)
        if steady
        else None,
        "first_epoch_s": round(epochs[0][1], 3) if epochs else None,
        "steady_epoch_s_median": round(statistics.median(t for _, t in steady), 3) if steady else None,
        "compile_s": compile_info["total"],
        "time_to_threshold_s": round(hit["wall_s"], 2) if hit else None,
        # The same wall time less the compile seconds spent before that eval ended.
        "time_to_threshold_excl_compile_s": round(hit["wall_s"] - hit["compile_s"], 2) if hit else None,
        "env_steps_to_threshold": hit["env_steps"] if hit else None,
        "final_eval_return": round(evals[-1]["eval_return"], 2) if evals else None,
        "best_eval_return": round(max(e["eval_return"] for e in evals), 2) if evals else None,
        "eval_s_total": round(sum(e["eval_s"] for e in evals if e["eval_s"] is not None), 2),
        "train_call_wall_s": round(total_wall, 2),
        "compile_breakdown_s": compile_info,
        # [env_steps, wall_s, eval_return, eval_s] per evaluation.
        "evals": [
            [e["env_steps"], round(e["wall_s"], 2), round(e["eval_return"], 2), round(e["eval_s"] or 0.0, 2)]
            for e in evals
        ],
    }
    if extra:
        out.update(extra)
    log(
        f"[{name}] steady {out['steady_steps_per_sec']} steps/s (median epoch "
        f"{out['steady_steps_per_sec_median_epoch']}) | compile {out['compile_s']} s | time to "
        f"{threshold:g}: {out['time_to_threshold_s']} s ({out['time_to_threshold_excl_compile_s']} s excl. "
        f"compile) | final eval {out['final_eval_return']} | evals {out['eval_s_total']} s | "
        f"wall {out['train_call_wall_s']} s"
    )
    log(f"[{name}] compile by function: {compile_info['top_functions']}")
    return out


def _median_summary(runs: list[dict]) -> dict:
    """Median over repeats of every numeric figure; the runs themselves are kept."""
    if len(runs) == 1:
        return runs[0]
    out = {}
    for k, v in runs[0].items():
        vals = [r.get(k) for r in runs]
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if all(x is not None for x in vals):
                out[k] = round(statistics.median(vals), 3)
            else:
                out[k] = None  # e.g. the threshold was not reached in every run
    out["runs"] = runs
    return out


def _schedule(args, how: str) -> list[str]:
    """The sides' runs in order: ``args.order`` first, ``args.repeats`` times, alternating
    who goes first (``args.only`` picks one side)."""
    first = ["brax", "ours"] if args.order == "brax-first" else ["ours", "brax"]
    if args.only != "both":
        first = [args.only]
    schedule = [side for r in range(args.repeats) for side in (first if r % 2 == 0 else first[::-1])]
    log(f"order: {' -> '.join(schedule)} ({how}; repeats alternate who goes first)")
    return schedule


def run_sides(args, clock, run_brax, run_ours) -> tuple[list[str], dict]:
    """Runs Brax's side and ours in the order ``args.order`` says (``args.repeats`` times,
    alternating who goes first; ``args.only`` picks one side) and returns the order and
    each side's median summary."""
    schedule = _schedule(args, "one process, sequential")
    runs: dict[str, list[dict]] = {}
    for i, side in enumerate(schedule):
        log(f"--- {side} (run {i + 1}/{len(schedule)}) ---")
        runs.setdefault(side, []).append((run_brax if side == "brax" else run_ours)(args, clock))
    return schedule, {side: _median_summary(r) for side, r in runs.items()}


# Options of the parent's command line that the child processes of `run_sides_in_processes`
# get in their own form (one side each, one run each) or not at all.
_PARENT_ONLY = {"--only": 1, "--repeats": 1, "--order": 1, "--processes": 1, "--cpus": 1}


def _child_argv(argv: list[str], side: str) -> list[str]:
    out, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
            continue
        name = a.split("=", 1)[0]
        if name in _PARENT_ONLY:
            skip = 0 if "=" in a else _PARENT_ONLY[name]
            continue
        out.append(a)
    return [*out, "--only", side, "--repeats", "1", "--processes", "one"]


def run_child(cmd: list[str], env: dict, who: str, cpus: list[int] | None = None) -> dict:
    """Runs ``cmd`` with ``env`` (pinned to ``cpus`` before it starts, so every thread it
    starts stays there): its progress lines pass through as they come, its last line (a
    JSON summary) is kept back and returned parsed, so that the caller's own summary stays
    the last line. A failed child ends this process with an error naming ``who``."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, preexec_fn=pin) as proc:
        last = None
        for line in proc.stdout:
            if last is not None:
                print(last, end="", flush=True)
            last = line
    if proc.returncode != 0 or not last:
        raise SystemExit(f"error: {who}'s process exited with {proc.returncode}; its output is above")
    return json.loads(last)


def parse_cpus(spec: str | None) -> list[int]:
    """``0-1`` or ``0,2`` -> the cores; None -> every core this process may use. One error
    line for a core this process may not use."""
    allowed = sorted(os.sched_getaffinity(0))
    if spec is None:
        return allowed
    cpus = []
    try:
        for part in str(spec).split(","):
            lo, _, hi = part.partition("-")
            cpus += list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise SystemExit(f"error: --cpus {spec}: give cores as 0-1 or 0,2") from None
    if not cpus or not set(cpus) <= set(allowed):
        raise SystemExit(f"error: --cpus {spec}: this process may use only cores {allowed}")
    return sorted(set(cpus))


def run_sides_in_processes(args, argv: list[str], script: str, own_env, cpus: list[int] | None = None
                           ) -> tuple[list[str], dict]:
    """``run_sides`` with every run in a fresh process of its own, started as its users
    start it: ``own_env(side)`` gives each side's environment (Brax's: the caller's,
    without the project's XLA flags; ours: what ``python -m rlinf_jax.train`` would start
    JAX with), and with ``cpus`` both sides pinned to those cores. The children's progress
    passes through; each one's summary is its last stdout line, with the float32 peak the
    child measured (``peak_flops_per_s``) where it measured one."""
    schedule = _schedule(args, "each run in its own process")
    runs: dict[str, list[dict]] = {}
    for i, side in enumerate(schedule):
        env = own_env(side)
        log(f"--- {side} (run {i + 1}/{len(schedule)}, own process, cores {cpus or 'any'}, "
            f"XLA_FLAGS={env.get('XLA_FLAGS', '')!r}) ---")
        child = run_child([sys.executable, script, *_child_argv(argv, side)], env, f"the {side} run", cpus)
        summary = child.get(side)
        summary["xla_flags"] = env.get("XLA_FLAGS", "")
        if child.get("peak_flops_per_s"):
            summary["peak_flops_per_s"] = child["peak_flops_per_s"]
        runs.setdefault(side, []).append(summary)
    return schedule, {side: _median_summary(r) for side, r in runs.items()}


def own_processes_keys(results: dict, cpus: list[int], peak_gflops: float | None) -> dict:
    """What every own-process comparison adds to its JSON: the pinning, the threads, and
    our side's FLOP/s against the float32 peak its process measured on the same cores
    (``--peak-gflops`` instead when given; no JAX runs in the parent)."""
    peak = peak_gflops * 1e9 if peak_gflops else (results.get("ours") or {}).get("peak_flops_per_s")
    return {
        "pinning": f"both sides on cores {cpus} (sched_setaffinity before each starts), one process at a time",
        "threads": "XLA's defaults on both sides (the same CPU backend)",
        **flops_keys(results, peak),
    }


def our_default_env(recipe: str) -> dict:
    """This process's environment with XLA_FLAGS as ``python -m rlinf_jax.train
    --config-name recipe`` sets them before JAX starts (``runner.xla_cpu_flags``'s default)."""
    saved = os.environ.get("XLA_FLAGS")
    try:
        from rlinf_jax.api import prepare_jax

        prepare_jax(recipe)
        return dict(os.environ)
    finally:
        if saved is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = saved


def ratio(results: dict, key: str):
    """Ours / Brax's figure ``key`` (None when either side lacks it)."""
    a, b = (results.get("ours") or {}).get(key), (results.get("brax") or {}).get(key)
    return round(a / b, 3) if a is not None and b else None


def flops_per_env_step(fn, args, env_steps: int) -> float:
    """FLOPs per env step of ``fn(*args)``, a program running ``env_steps`` env steps and
    their updates (its while loop, the chunk's traced iteration count, taken once)."""
    from roofline import program_flops

    return program_flops(fn, *args, while_trips=1) / env_steps


def flops_keys(results: dict, peak: float | None) -> dict:
    """Our side's steady FLOP/s (FLOPs per env step times steady env steps/s) and its share
    of ``peak`` (None: not measured), logged and returned as the result's new keys."""
    from roofline import line, rate, result_keys

    ours = results.get("ours") or {}
    if not ours.get("flops_per_env_step") or not ours.get("steady_steps_per_sec"):
        return {}
    r = rate(ours["flops_per_env_step"], 1.0 / ours["steady_steps_per_sec"], peak or float("nan"))
    if peak is None:
        r["share_of_peak"] = None
        log(f"[ours] steady FLOP/s: {r['flop_per_s'] / 1e9:,.2f} GFLOP/s (no peak measured: --peak-gflops)")
    else:
        log(line("[ours] steady FLOP/s", r, peak))
    keys = result_keys(r, peak or 0.0)
    keys.pop("ours_flops")  # per env step, already in "ours"
    keys["peak_flops_per_s"] = None if peak is None else float(f"{peak:.4g}")
    return keys
