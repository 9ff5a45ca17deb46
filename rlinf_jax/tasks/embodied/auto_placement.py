"""Auto-placement: profile the stages of a few layouts, predict, pick the fastest.

``cluster.component_placement=auto`` considers the layouts that make sense on the
devices present (all collocated and fused; env+rollout apart from the actor; env,
rollout and actor each apart; env and rollout apart with the actor spanning both) at one
or more micro-batch counts. For each it builds the real stages and times them briefly:

    R = one rollout of the whole env batch (env and rollout stages, micro-batched)
    L = one actor update on that batch (with cluster.scaling=dynamic, the state's moves to
        the update's devices and back included)
    F = one fused iteration (the collocated single-jit layout only)

and predicts an iteration's time as ``R + L``, or, where the rollout may overlap the
update (``flow.max_staleness >= 1`` and the actor on devices of its own), as ``R || L``:
the two enqueued together and timed together. ``max(R, L)`` would be the ideal, but
devices that share a host's CPU cores (forced host devices; CPU-side work on a GPU
host) slow each other down, and only the joint timing sees that.
The layout with the best predicted env-steps/s wins; the plan, every prediction and
later the measured throughput go into ``placement.json`` and ``metrics.jsonl``.

Profiling compiles each candidate's stages once; the winner's trainer is kept, so
nothing compiles twice.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import jax

from rlinf_jax.config.schema import Config
from rlinf_jax.flow.fused import Fused
from rlinf_jax.errors import BadInput
from rlinf_jax.sharding import Placement
from rlinf_jax.sharding.mesh import fetch
from rlinf_jax.tasks.embodied.layouts import placed_trainer, resolve_embodied_placement
from rlinf_jax.tasks.embodied.setup import Setup


@dataclass(frozen=True)
class Candidate:
    name: str
    spec: dict
    num_micro_batches: int = 1
    scaling: str = "static"  # cluster.scaling: dynamic lends the rollout's devices to the update


@dataclass
class Profile:
    candidate: Candidate
    mode: str
    rollout_ms: float
    learn_ms: float
    overlap: bool
    overlapped_ms: float | None
    iteration_ms: float
    predicted_env_steps_per_sec: float

    def to_json(self) -> dict:
        return {
            "name": self.candidate.name,
            "placement": self.candidate.spec,
            "num_micro_batches": self.candidate.num_micro_batches,
            "scaling": self.candidate.scaling,
            "mode": self.mode,
            "rollout_ms": round(self.rollout_ms, 3),
            "learn_ms": round(self.learn_ms, 3),
            "overlap": self.overlap,
            "overlapped_ms": None if self.overlapped_ms is None else round(self.overlapped_ms, 3),
            "predicted_iteration_ms": round(self.iteration_ms, 3),
            "predicted_env_steps_per_sec": round(self.predicted_env_steps_per_sec, 1),
        }


@dataclass
class AutoPlan:
    placement: Placement
    cfg: Config
    chosen: Profile
    profiles: list[Profile]
    trainer: object = field(repr=False, default=None)
    profile_sec: float = 0.0
    # Every profiled candidate's trainer (compiled), in `profiles` order.
    trainers: list = field(repr=False, default_factory=list)

    def to_json(self) -> dict:
        return {
            "chosen": self.chosen.candidate.name,
            "predicted_env_steps_per_sec": round(self.chosen.predicted_env_steps_per_sec, 1),
            "profile_sec": round(self.profile_sec, 2),
            "candidates": [p.to_json() for p in self.profiles],
        }


def _span(lo: int, hi: int) -> str:
    return str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}"


def candidates(num_devices: int, num_envs: int, max_staleness: int = 0) -> list[Candidate]:
    """The layouts worth profiling on ``num_devices`` devices; on-policy
    (``max_staleness`` 0), the disaggregated ones also with the update borrowing the
    rollout's devices (cluster.scaling=dynamic)."""
    n = num_devices
    out = [Candidate("collocated", {"env,rollout,actor": _span(0, n)})]
    if n >= 2:
        half = n // 2
        spec = {"env,rollout": _span(0, n - half), "actor": _span(n - half, n)}
        out.append(Candidate("disaggregated", spec))
        if max_staleness == 0:
            out.append(Candidate("disaggregated-dynamic", spec, 1, "dynamic"))
        if n >= 4:
            q = (n - half) // 2
            spec = {"env": _span(0, q), "rollout": _span(q, n - half), "actor": _span(n - half, n)}
            out.append(Candidate("disaggregated-3way", spec, 2))
            if max_staleness == 0:
                out.append(Candidate("disaggregated-3way-dynamic", spec, 2, "dynamic"))
        out.append(Candidate("hybrid", {"env": _span(0, half), "rollout": _span(half, n), "actor": _span(0, n)}, 2))
    return [c for c in out if num_envs % c.num_micro_batches == 0]


def _candidate_cfg(cfg: Config, cand: Candidate) -> Config:
    c = copy.deepcopy(cfg)
    c.cluster.component_placement = dict(cand.spec)
    c.flow.num_micro_batches = cand.num_micro_batches
    c.cluster.scaling = cand.scaling
    c.flow.runner = "auto"
    return c


def _timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def profile(cfg: Config, setup: Setup, cand: Candidate, num_devices: int, repeats: int = 3):
    """Builds ``cand``'s trainer and times its stages; returns (Profile, trainer)."""
    ccfg = _candidate_cfg(cfg, cand)
    placement = resolve_embodied_placement(ccfg, num_devices)
    trainer = placed_trainer(ccfg, setup, placement)
    state = trainer.init()
    if isinstance(trainer, Fused):
        holder = {"ts": state}

        def fused():
            holder["ts"], sums = trainer.run_chunk(holder["ts"], 1)
            return sums

        fused()  # compile
        f = _timed(fused, repeats)
        rollout_ms, learn_ms, overlap, both, iteration = f, 0.0, False, None, f
    else:
        def rollout():
            return trainer.rollout(state)[0]

        segment, learn_keys = trainer.rollout(state)  # compile
        # The learner's own copy: its updates donate their state, which the rollout reads.
        held = {"learner": trainer.start(fetch(trainer.snapshot(state))).learner}

        def learn():  # with its moves to the update's devices and back, where it has them
            held["learner"], metrics = trainer.update(held["learner"], segment, learn_keys)
            return metrics

        learn()  # compile
        rollout_ms = _timed(rollout, repeats)
        learn_ms = _timed(learn, repeats)
        env_rollout = set(placement.components["env"].devices) | set(placement.components["rollout"].devices)
        overlap = cfg.flow.max_staleness >= 1 and env_rollout.isdisjoint(placement.components["actor"].devices)
        both = None
        if overlap:
            # The update first, then the rollout: the order the staged runner enqueues them.
            both = _timed(lambda: (learn(), rollout()), repeats)
        iteration = both if overlap else rollout_ms + learn_ms
    steps = trainer.env_steps_per_iteration / (iteration / 1e3)
    return Profile(cand, placement.mode, rollout_ms, learn_ms, overlap, both, iteration, steps), trainer


def auto_placement(
    cfg: Config, setup: Setup, num_devices: int, cands: list[Candidate] | None = None, log=None, repeats: int = 3
) -> AutoPlan:
    """Profiles ``cands`` (default: `candidates`) and returns the plan with the best one;
    each stage's time is its fastest of ``repeats``."""
    t0 = time.perf_counter()
    cands = candidates(num_devices, cfg.env.num_envs, cfg.flow.max_staleness) if cands is None else cands
    profiles, trainers = [], []
    for cand in cands:
        try:
            prof, trainer = profile(cfg, setup, cand, num_devices, repeats)
        except BadInput as e:  # e.g. a batch that does not split over this layout
            if log:
                log(f"auto-placement: skip {cand.name}: {e}")
            continue
        profiles.append(prof)
        trainers.append(trainer)
        if log:
            log(
                f"auto-placement: {cand.name:<20} rollout {prof.rollout_ms:8.1f} ms  learn {prof.learn_ms:8.1f} ms  "
                f"-> {prof.predicted_env_steps_per_sec:,.0f} env-steps/s predicted"
            )
    if not profiles:
        raise BadInput(f"cluster.component_placement=auto: no layout fits env.num_envs={cfg.env.num_envs} on {num_devices} device(s)")
    best = max(range(len(profiles)), key=lambda i: profiles[i].predicted_env_steps_per_sec)
    chosen, trainer = profiles[best], trainers[best]
    return AutoPlan(
        placement=trainer.placement,
        cfg=_candidate_cfg(cfg, chosen.candidate),
        chosen=chosen,
        profiles=profiles,
        trainer=trainer,
        profile_sec=time.perf_counter() - t0,
        trainers=trainers,
    )
