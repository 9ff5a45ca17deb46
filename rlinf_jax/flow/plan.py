"""A run on paper: its programs compiled for a target's chips, what each chip holds, and how
long an iteration should take.

A task describes its iteration as `Program`s (a jitted function, abstract arguments laid
out on the component's mesh, how often it runs per iteration) and `Resident` state (what
stays on the chips between phases: parameters, optimiser state, the reference model).
`plan_programs` compiles every program with XLA's compiler for the target (the real TPU
compiler, through abstract devices) and reads back what the compiler itself reports:

- memory per chip (`compiled.memory_analysis()`): arguments, outputs, temporaries, and the
  buffers an output reuses from a donated argument;
- work per call (`compiled.cost_analysis()`): FLOPs and bytes accessed.

A chip's peak while a program runs is its arguments, outputs and temporaries (less what
donation lets the outputs reuse), plus every other component's resident state on that
chip. The run fits when every program's peak stays under the chip's memory less a margin.
A program the compiler itself refuses (its temporaries exceed the chip) is reported with
the compiler's figure, not as a crash.

The time per call is a roofline bound: the larger of FLOPs over the chip's peak FLOP/s and
bytes over its memory bandwidth. It assumes perfect overlap and ignores communication
between chips and host work (the reward, the data), so a real iteration is slower; the
model FLOPs utilisation it implies is an upper bound of what the hardware could reach.
"""

from __future__ import annotations

import contextlib
import copy
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax._src import xla_bridge  # the host's backend, for costing lowered programs
from jax._src.lib import _jax  # hlo_module_cost_analysis: no public API costs a lowered program
from jax.experimental.compilation_cache import compilation_cache

from rlinf_jax.errors import BadInput
from rlinf_jax.flow import runners
from rlinf_jax.flow.analyses import Analyses, Analysis
from rlinf_jax.sharding import component_mesh, resolve_num_devices, resolve_placement
from rlinf_jax.sharding.targets import GIB, GPU_ESTIMATE_NOTE, Chip, Target

# Left free on every chip for what no program accounts for: the runtime's own buffers,
# fragmentation, the host transfers of a batch.
MEMORY_MARGIN = 0.05

_OOM = re.compile(r"memory required for HLO temporaries \((?P<temp>[\d.]+)(?P<unit>[KMGT])\)")
_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class NotPlanned(BadInput):
    """A run the planner does not know how to lay out (a staged layout, a host simulator):
    bad input to `python -m rlinf_jax.plan`; the check before a run's first step skips it."""


@dataclass
class Program:
    """One jitted program of an iteration, with the arguments it is called with (abstract:
    `jax.ShapeDtypeStruct`s carrying their shardings)."""

    component: str
    name: str
    fn: Callable  # a jax.jit-wrapped function
    args: tuple
    kwargs: dict = field(default_factory=dict)
    calls: float = 1.0  # calls per iteration
    # A while loop's body runs this many times per call, but the compiler's cost analysis
    # counts it once: the decode loop's per-call cost is its body's times the tokens.
    loop_trips: int = 1
    model_flops: float = 0.0  # the model's own FLOPs per call (for the utilisation)
    holds: tuple[str, ...] = ()  # the residents this program takes as arguments
    # The other trips of loops inside the program (scans over micro-batches, over
    # optimiser steps), which the compiler's cost analysis counts once: ``(jitted fn,
    # args, how many more times it runs per call)``, costed from the lowered program.
    more: tuple = ()
    # The same program with its layers unrolled (a scanned model's layer loop is counted
    # once too), lowered but never compiled: where the FLOPs are counted.
    twin: Program | None = None
    # cluster.scaling=dynamic: the state this program's arguments take from where it rests
    # and give back after each call, as ``(at rest, during the call)`` (abstract, laid out):
    # the planner adds the two moves' time (`switch_seconds`).
    switch: tuple = ()


@dataclass
class Resident:
    """State that stays on a component's chips between the phases of an iteration."""

    component: str
    name: str
    tree: Any  # abstract arrays with their shardings
    # Components during whose programs it is not held (released before they run and
    # rebuilt after: the rollout's copy of the weights during the actor's update).
    absent_during: tuple[str, ...] = ()


@dataclass
class ProgramReport:
    component: str
    name: str
    argument_bytes: float
    output_bytes: float
    alias_bytes: float
    temp_bytes: float
    others_bytes: float  # other residents on the same chips while it runs
    flops: float
    bytes_accessed: float
    predicted_s: float  # per call
    calls: float
    model_flops: float
    compile_s: float
    refused: str = ""  # the compiler's own out-of-memory message, when it refused
    switch_s: float = 0.0  # per call: the state's moves there and back (cluster.scaling=dynamic)
    cached: bool = False  # the compiler's figures read back from an earlier plan (`flow.analyses`)

    @property
    def peak_bytes(self) -> float:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.others_bytes

    def to_json(self) -> dict:
        out = {
            "argument_gib": round(self.argument_bytes / GIB, 4),
            "output_gib": round(self.output_bytes / GIB, 4),
            "temp_gib": round(self.temp_bytes / GIB, 4),
            "others_gib": round(self.others_bytes / GIB, 4),
            "peak_gib": round(self.peak_bytes / GIB, 4),
            "flops": self.flops,
            "bytes_accessed": self.bytes_accessed,
            "predicted_s": self.predicted_s,
            "calls_per_iteration": self.calls,
            "compile_s": round(self.compile_s, 1),
        }
        if self.cached:
            out["compiled"] = "earlier, read back from the plan cache"
        if self.switch_s:
            out["switch_s"] = None if np.isnan(self.switch_s) else self.switch_s
        if self.refused:
            out["refused"] = self.refused
        return out


def fused_layout(cfg, components: Sequence[str], devices, workload: str):
    """``(placement, the actor's mesh)`` of a run whose fused trainer the planner lays out
    (every component collocated, on-policy, one micro-batch); `NotPlanned` for a layout that
    runs as stages, and for ``auto``, which `rlinf_jax.api.plan` plans layout by layout (the
    check before a run's first step cannot)."""
    if cfg.cluster.component_placement == "auto":
        raise NotPlanned("cluster.component_placement=auto is planned layout by layout: plan a named one")
    placement = resolve_placement(cfg.cluster.component_placement, components, len(devices), cfg.cluster.mesh)
    if not runners.fused(cfg.flow, placement):
        f = cfg.flow
        raise NotPlanned(
            f"planning {workload} plans the fused trainer (every component collocated, flow.num_micro_batches=1, "
            f"flow.max_staleness=0); this layout ({placement.mode}, {f.num_micro_batches} micro-batch(es), "
            f"staleness {f.max_staleness}, flow.runner={f.runner}) runs as stages, which the planner does not know "
            "yet: plan it with cluster.component_placement=collocated"
        )
    return placement, component_mesh(placement, "actor", devices)


def with_unrolled_twins(build, cfg, devices, twins: bool = True):
    """``build(cfg, devices)``'s programs, residents and notes; with ``twins`` and a scanned
    model, each program carries the same program built with the layers unrolled (lowered,
    never compiled: where the planner counts FLOPs, since the compiler counts a loop once)."""
    out, residents, notes = build(cfg, devices)
    if cfg.actor.model.scan_layers and twins:
        unrolled = copy.deepcopy(cfg)
        unrolled.actor.model.scan_layers = False
        twin = {(p.component, p.name): p for p in build(unrolled, devices)[0]}
        for p in out:
            p.twin = twin[(p.component, p.name)]
    return out, residents, notes


def laid_out(tree, shardings):
    """``tree``'s leaves as `jax.ShapeDtypeStruct`s laid out by ``shardings``: the abstract
    arguments a program is compiled for."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def param_count(tree) -> int:
    return int(sum(x.size for x in jax.tree.leaves(tree)))


def bytes_per_chip(tree) -> float:
    """The most bytes any one device holds of ``tree`` (abstract or real arrays, laid out by
    their shardings; a leaf without one counts whole)."""
    per_device: dict[Any, float] = {}
    whole = 0.0
    for leaf in jax.tree.leaves(tree):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            continue
        size = np.dtype(dtype).itemsize if not jax.dtypes.issubdtype(dtype, jax.dtypes.extended) else 8
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            whole += float(np.prod(shape)) * size
            continue
        shard = sharding.shard_shape(tuple(shape))
        for device in sharding.device_set:
            per_device[device] = per_device.get(device, 0.0) + float(np.prod(shard)) * size
    return whole + (max(per_device.values()) if per_device else 0.0)


def devices_of(tree) -> frozenset:
    out: set = set()
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            out |= set(sharding.device_set)
    return frozenset(out)


def _refusal(e: Exception) -> tuple[str, float] | None:
    """The compiler's out-of-memory refusal and the temporaries it named, or None."""
    text = str(e)
    if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
        return None
    m = _OOM.search(text)
    temp = float(m.group("temp")) * _UNITS[m.group("unit")] if m else float("nan")
    line = next((ln.strip() for ln in text.splitlines() if "memory" in ln.lower()), text.splitlines()[0])
    return line[:300], temp


def global_costs(fn, args, kwargs=None) -> tuple[float, float]:
    """FLOPs and bytes of the whole computation (every chip's share together, before the
    compiler partitions and fuses it), from the lowered program: seconds, no compile. The
    host CPU's XLA costs it, since a compile-only TPU client has no cost analysis for
    programs it has not compiled."""
    hlo = fn.lower(*args, **(kwargs or {})).compiler_ir("hlo").as_hlo_module()
    analysis = _jax.hlo_module_cost_analysis(xla_bridge.get_backend("cpu"), hlo) or {}
    return float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0))


def program_costs(p: Program, compiled: Analysis) -> tuple[float, float]:
    """FLOPs and bytes per chip of one call of ``p``, every loop trip counted.

    The compiler's cost analysis is per chip and after fusion, but it counts a loop's body
    once whatever its trip count: the layers of a scanned model, the micro-batches of an
    update, the tokens of a decode loop. The whole computation's costs with every loop
    counted come from the lowered programs instead: the program with its layers unrolled
    (``p.twin``; lowering takes seconds where compiling 28 unrolled layers takes minutes),
    times a while loop's trips (``loop_trips``), plus the other trips of its scans
    (``more``). They are brought to one chip, fused, by the compiled / lowered ratio of the
    program as compiled (its share of the work, and what fusion saved).
    """
    compiled_flops, compiled_bytes = compiled.flops, compiled.bytes_accessed
    own_flops, own_bytes = global_costs(p.fn, p.args, p.kwargs)
    if not own_flops:  # nothing to scale: the compiler's figures as they are
        return compiled_flops * p.loop_trips, compiled_bytes * p.loop_trips
    source = p.twin if p.twin is not None else p
    flops, accessed = (own_flops, own_bytes) if p.twin is None else global_costs(source.fn, source.args, source.kwargs)
    flops, accessed = flops * p.loop_trips, accessed * p.loop_trips
    for fn, args, times in source.more:
        more_flops, more_bytes = global_costs(fn, args)
        flops, accessed = flops + times * more_flops, accessed + times * more_bytes
    return flops * compiled_flops / own_flops, accessed * (compiled_bytes / own_bytes if own_bytes else 1.0)


def roofline_s(flops: float, bytes_accessed: float, chip: Chip) -> float:
    return max(flops / chip.peak_flops, bytes_accessed / chip.hbm_bytes_per_s)


def switch_seconds(at_rest, during, chip: Chip) -> float:
    """The time to move a state from its resting layout to a phase's and back: each way,
    the busiest chip sends its share or receives its new one over its links at half the
    published two-way bandwidth. A bound like the roofline's (no hops, no contention);
    NaN where the chip's bandwidth is not published."""
    if not chip.ici_bytes_per_s:
        return float("nan")
    one_way = chip.ici_bytes_per_s / 2
    return 2 * max(bytes_per_chip(at_rest), bytes_per_chip(during)) / one_way


def compile_program(p: Program, chip: Chip, residents: Sequence[Resident], costs: bool = True,
                    analyses: Analyses | None = None) -> ProgramReport:
    """``p`` compiled for ``chip``'s devices; its figures, or the compiler's refusal. Without
    ``costs``, memory alone (no FLOPs, no time: the check before a run's first step). With
    ``analyses``, a compile of the same program text for the same chips is read back
    instead of compiled again."""
    devices = devices_of((p.args, p.kwargs))
    others = [r for r in residents
              if r.name not in p.holds and p.component not in r.absent_during and devices & devices_of(r.tree)]
    others_bytes = sum(bytes_per_chip(r.tree) for r in others)
    t0 = time.perf_counter()
    lowered = p.fn.lower(*p.args, **p.kwargs)
    # A memory-only compile reads no costs, so it neither reads nor writes the cache.
    key = analyses.key(lowered, [d.id for d in devices]) if analyses is not None and costs else None
    found = analyses.get(key) if key is not None else None
    cached = found is not None
    if found is None:
        try:
            found = Analysis.of(lowered.compile(), costs)
        except Exception as e:  # the compiler's refusals arrive as XlaRuntimeError
            refused = _refusal(e)
            if refused is None:
                raise
            message, temp = refused
            found = Analysis(argument_bytes=bytes_per_chip((p.args, p.kwargs)), temp_bytes=temp, refused=message)
        if key is not None:
            analyses.put(key, found)
    compile_s = time.perf_counter() - t0
    if found.refused:
        return ProgramReport(p.component, p.name, found.argument_bytes, 0.0, 0.0, found.temp_bytes, others_bytes,
                             0.0, 0.0, float("nan"), p.calls, p.model_flops, compile_s, refused=found.refused,
                             cached=cached)
    flops, accessed = program_costs(p, found) if costs else (0.0, 0.0)
    return ProgramReport(
        p.component, p.name, found.argument_bytes, found.output_bytes, found.alias_bytes, found.temp_bytes,
        others_bytes, flops, accessed, roofline_s(flops, accessed, chip) if costs else float("nan"), p.calls,
        p.model_flops, compile_s, switch_s=switch_seconds(*p.switch, chip) if p.switch and costs else 0.0,
        cached=cached,
    )


@dataclass
class PlanReport:
    """Every program's figures on a target, and the verdict."""

    target: str
    chip: Chip
    chips: int
    hosts: int
    reports: list[ProgramReport]
    notes: list[str] = field(default_factory=list)  # how the run was laid out, what was assumed
    remedies: list[dict] = field(default_factory=list)  # what would bring a run that does not fit under the line
    auto: dict | None = None  # what automatic placement compared, and chose

    @property
    def budget_bytes(self) -> float:
        return self.chip.hbm_gib * GIB * (1.0 - MEMORY_MARGIN)

    @property
    def largest(self) -> ProgramReport:
        return max(self.reports, key=lambda r: r.peak_bytes if not np.isnan(r.peak_bytes) else float("inf"))

    @property
    def fits(self) -> bool:
        return all(not r.refused and r.peak_bytes <= self.budget_bytes for r in self.reports)

    @property
    def predicted_iteration_s(self) -> float | None:
        """Phases one after the other (every workload here is on-policy: generation, then
        scoring, then the update): the sum of each program's calls."""
        # No prediction where a program was refused, or where the state's moves cannot be
        # costed (a chip whose interconnect bandwidth is not published).
        if any(r.refused or np.isnan(r.switch_s) for r in self.reports):
            return None
        return sum((r.predicted_s + r.switch_s) * r.calls for r in self.reports)

    @property
    def switch_s(self) -> float:
        """Per iteration: the time the state's moves between meshes take (cluster.scaling=dynamic)."""
        return sum(r.switch_s * r.calls for r in self.reports)

    @property
    def mfu(self) -> float | None:
        t = self.predicted_iteration_s
        model = sum(r.model_flops * r.calls for r in self.reports)
        if not t or not model:
            return None
        return model / (t * self.chips * self.chip.peak_flops)

    def verdict(self) -> str:
        budget = self.budget_bytes / GIB
        if self.fits:
            worst = self.largest
            return (
                f"fits: the largest program, {worst.component}/{worst.name}, peaks at {worst.peak_bytes / GIB:.2f} GiB "
                f"per chip of {self.chip.hbm_gib:g} GiB ({budget:.2f} usable)"
            )
        worst = self.largest
        if worst.refused:
            return f"does not fit: the compiler refused {worst.component}/{worst.name} ({worst.refused})"
        return (
            f"does not fit: {worst.component}/{worst.name} needs {worst.peak_bytes / GIB:.2f} GiB per chip, more than "
            f"the {budget:.2f} GiB usable of a {self.chip.name} chip's {self.chip.hbm_gib:g} GiB"
        )

    def to_json(self) -> dict:
        components: dict[str, dict] = {}
        for r in self.reports:
            components.setdefault(r.component, {"programs": {}})["programs"][r.name] = r.to_json()
        t = self.predicted_iteration_s
        return {
            "target": self.target,
            "chip": self.chip.name,
            "platform": self.chip.platform,
            # Which compiler's analyses these are: the target's own, or XLA's CPU compiler
            # standing in for a GPU's (an estimate, see `sharding.targets`).
            "compiler": "xla cpu, standing in for the gpu" if self.chip.platform == "gpu" else self.chip.platform,
            "chips": self.chips,
            "hosts": self.hosts,
            "hbm_per_chip_gib": self.chip.hbm_gib,
            "usable_per_chip_gib": round(self.budget_bytes / GIB, 4),
            "peak_per_chip_gib": round(max(r.peak_bytes for r in self.reports) / GIB, 4),
            "fits": self.fits,
            "largest_program": f"{self.largest.component}/{self.largest.name}",
            "predicted_iteration_s": None if t is None else round(t, 6),
            "predicted_mfu": None if self.mfu is None else round(self.mfu, 4),
            **({"predicted_switch_s": None if np.isnan(self.switch_s) else self.switch_s}
               if self.switch_s else {}),
            "prediction": "roofline bound: max(FLOPs / peak FLOP/s, bytes / HBM bandwidth) per call, phases in sequence",
            "components": components,
            "remedies": self.remedies,
            "notes": self.notes,
            **({"auto_placement": self.auto} if self.auto is not None else {}),
        }

    def table(self) -> str:
        """The report as fixed-width text, one row per program."""
        head = (f"{'component':<10} {'program':<12} {'args':>7} {'out':>7} {'temp':>7} {'others':>7} {'peak':>7} "
                f"{'TFLOP':>9} {'GB read':>9} {'ms/call':>9} {'calls':>6}")
        lines = [f"plan for {self.target}: {self.chips} {self.chip.name} chips ({self.hosts} host(s)), "
                 f"{self.chip.hbm_gib:g} GiB HBM, {self.chip.peak_flops / 1e12:g} TFLOP/s bf16, "
                 f"{self.chip.hbm_bytes_per_s / 1e9:g} GB/s per chip; GiB per chip:", head, "-" * len(head)]
        for r in self.reports:
            if r.refused:
                lines.append(f"{r.component:<10} {r.name:<12} {r.argument_bytes / GIB:>7.2f} {'-':>7} "
                             f"{r.temp_bytes / GIB:>7.2f} {r.others_bytes / GIB:>7.2f} {'refused':>7}")
                continue
            lines.append(
                f"{r.component:<10} {r.name:<12} {r.argument_bytes / GIB:>7.2f} {r.output_bytes / GIB:>7.2f} "
                f"{r.temp_bytes / GIB:>7.2f} {r.others_bytes / GIB:>7.2f} {r.peak_bytes / GIB:>7.2f} "
                f"{r.flops / 1e12:>9.3f} {r.bytes_accessed / 1e9:>9.2f} {r.predicted_s * 1e3:>9.2f} {r.calls:>6g}"
            )
        t, mfu = self.predicted_iteration_s, self.mfu
        if t is not None:
            util = f", model FLOPs utilisation {mfu:.1%}" if mfu is not None else ""
            lines.append(f"predicted iteration (roofline bound, phases in sequence): {t:.3f} s{util}")
        if self.switch_s:
            moved = ("not counted: this chip's interconnect bandwidth is not published" if np.isnan(self.switch_s)
                     else f"{self.switch_s:.3f} s of it")
            lines.append(f"the state's moves to the update's chips and back (cluster.scaling=dynamic): {moved}")
        lines += [f"note: {n}" for n in self.notes]
        for r in self.remedies:
            lines.append(f"remedy: {r['remedy']}: {r['effect']}")
        return "\n".join(lines)


@contextlib.contextmanager
def _no_persistent_cache():
    """Programs compiled for abstract chips cannot be loaded back (no client runs them), so
    the persistent compilation cache, which a run may have turned on, is off meanwhile."""
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # JAX decides whether to use the cache once, at first use
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()


def plan_cache(compilation_cache: str, target: Target) -> Analyses | None:
    """Where the compiler's analyses for ``target`` are kept: ``plans/`` in the run's JAX
    compilation cache (``runner.compilation_cache``; "" keeps none)."""
    if not compilation_cache:
        return None
    identity = f"{target.chip.platform}:{target.topology_name}:{target.chip_config}:{target.chips_per_host}"
    return Analyses(Path(compilation_cache).expanduser() / "plans", identity)


def plan_programs(target, programs: Sequence[Program], residents: Sequence[Resident], notes=(), progress=None,
                  costs: bool = True, analyses: Analyses | None = None) -> PlanReport:
    """Compiles every program for ``target`` (a `sharding.targets.Target`, or a `Devices`)
    and reports; with ``analyses`` (`plan_cache`), reads back what an earlier plan compiled."""
    reports = []
    # Programs for real devices may use the persistent cache: the run compiles them next.
    cache = _no_persistent_cache() if isinstance(target, Target) else contextlib.nullcontext()
    with cache:
        for i, p in enumerate(programs):
            if progress is not None:
                progress(f"compiling {p.component}/{p.name} for {target.text} ({i + 1}/{len(programs)})")
            reports.append(compile_program(p, target.chip, residents, costs, analyses))
    notes = list(notes)
    if isinstance(target, Target) and target.chip.platform == "gpu":
        notes.insert(0, GPU_ESTIMATE_NOTE.format(n=target.chips))
    return PlanReport(target.text, target.chip, target.chips, target.hosts, reports, notes)


@dataclass(frozen=True)
class Devices:
    """The devices a run is about to use, as a target to check: their memory as the backend
    reports it (no published peaks: a check of memory, not a prediction of time)."""

    chip: Chip
    chips: int
    hosts: int
    text: str


def device_memory_bytes(devices) -> float | None:
    """The smallest memory limit the backend reports for ``devices`` (GPUs, TPUs), or None
    where it reports none (XLA's CPU backend)."""
    limits = []
    for d in devices:
        try:
            stats = d.memory_stats()
        except Exception:  # a backend without memory statistics
            return None
        if not stats or not stats.get("bytes_limit"):
            return None
        limits.append(float(stats["bytes_limit"]))
    return min(limits) if limits else None


def refuse_unless_fits(programs_on: Callable, devices, progress=None) -> PlanReport | None:
    """Before a run's first step: its programs (``programs_on(devices)``, a task's planner)
    compiled for the devices it is about to use and their memory checked against what the
    backend reports each device holds; one `BadInput` line naming the largest program when
    they cannot fit, where the run would otherwise fail out of memory minutes in. Returns
    the report, or None on a backend that reports no memory limit (the CPU), where nothing
    is compiled."""
    limit = device_memory_bytes(devices)
    if limit is None:
        return None
    d = devices[0]
    chip = Chip(d.device_kind, limit / GIB, float("inf"), float("inf"), d.platform)
    hosts = len({getattr(x, "process_index", 0) for x in devices})
    target = Devices(chip, len(devices), hosts, f"{len(devices)} {d.device_kind} device(s)")
    programs, residents, notes = programs_on(devices)
    report = plan_programs(target, programs, residents, notes, progress, costs=False)
    if not report.fits:
        raise BadInput(
            f"{report.verdict()}; the run would stop out of memory. Plan a layout that fits with "
            "python -m rlinf_jax.plan --remedies (or cluster.memory_check=false to try anyway)"
        )
    return report


def check_before_first_step(cfg, programs_on: Callable, console=None) -> PlanReport | None:
    """``cluster.memory_check`` for any task: its planner's programs (``programs_on(devices)``)
    compiled for the run's devices and held against each device's memory before a warm
    start or the first step (`refuse_unless_fits`). Nothing happens on the CPU (no limit
    reported), with the check turned off, or for a layout the planner does not know (said
    on the console)."""
    if not cfg.cluster.memory_check:
        return None
    devices = jax.devices()[: resolve_num_devices(cfg.cluster.num_devices)]
    if device_memory_bytes(devices) is None:
        return None
    say = None if console is None else (lambda line: console.print(f"memory check: {line}"))
    try:
        report = refuse_unless_fits(programs_on, devices, say)
    except NotPlanned as e:
        if say is not None:
            say(f"skipped: {e}")
        return None
    if say is not None:
        say(report.verdict())
    return report
