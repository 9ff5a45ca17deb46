"""The config keys an off-policy run reads, and the checks only this task can make."""

from __future__ import annotations

import math

from rlinf_jax import kernels
from rlinf_jax.config.reads import Reads
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.mlp import ACTIVATIONS
from rlinf_jax.envs.host.suite import is_host_suite
from rlinf_jax.tasks.env_rl.keys import COMPUTE_DTYPES, ENV, HOST

ALGORITHMS = ("sac", "crossq", "rlpd", "iql")
# The algorithms that read a dataset of transitions (algorithm.offpolicy.demo_path).
WITH_DATA = ("rlpd", "iql")
CRITIC_NORMS = ("none", "layer", "batch_renorm")

COMMON = {"runner.*", "cluster.*", "flow.*", "algorithm.name"}
MODEL = {
    "actor.model.kind", "actor.model.policy_hidden_sizes", "actor.model.value_hidden_sizes",
    "actor.model.activation", "actor.model.min_std", "actor.model.compute_dtype", "actor.model.matmul",
}
OPTIM = {"actor.optim.lr", "actor.optim.critic_lr", "actor.optim.max_grad_norm", "actor.optim.b1"}
LOOP = {"algorithm.rollout_length", "algorithm.gamma", "algorithm.reward_scale", "algorithm.normalize_observations"} | {
    f"algorithm.offpolicy.{k}" for k in ("utd_ratio", "batch_size", "replay_size", "learning_starts",
                                         "replay_in_checkpoint")
}
SAC = {
    f"algorithm.offpolicy.{k}" for k in ("tau", "num_q", "num_min_q", "actor_q_reduce", "init_alpha", "learn_alpha",
                                         "target_entropy_per_dim", "policy_delay", "critic_norm")
}
RENORM = {"algorithm.offpolicy.renorm_momentum", "algorithm.offpolicy.renorm_warmup"}
DATA = {"algorithm.offpolicy.demo_path"}
IQL = {
    f"algorithm.offpolicy.{k}" for k in ("tau", "num_q", "expectile", "awr_temperature", "critic_norm",
                                         "offline_iterations")
}

HINTS = {
    "algorithm.num_minibatches": "off-policy updates sample algorithm.offpolicy.batch_size transitions per gradient step",
    "algorithm.update_epochs": "off-policy updates run algorithm.offpolicy.utd_ratio gradient steps per env step",
    "algorithm.clip_eps": "there is no ratio to clip in the off-policy family",
    "algorithm.offpolicy.tau": "crossq has no target network (its critic uses batch renormalisation)",
}


def reads(cfg: Config) -> Reads:
    name = cfg.algorithm.name
    keys = COMMON | ENV | MODEL | OPTIM | LOOP
    keys |= IQL if name == "iql" else SAC
    if name == "crossq":
        keys = (keys - {"algorithm.offpolicy.tau"}) | RENORM
    if name in WITH_DATA:
        keys |= DATA
    if name == "rlpd":
        keys |= {"algorithm.offpolicy.demo_ratio"}
    if is_host_suite(cfg.env):
        keys |= HOST
    if name != "crossq" and cfg.algorithm.offpolicy.critic_norm == "batch_renorm":
        keys |= RENORM
    return Reads(frozenset(keys), HINTS)


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise BadInput(msg)


def check(cfg: Config) -> None:
    name, a, m = cfg.algorithm.name, cfg.algorithm.offpolicy, cfg.actor.model
    _require(name in ALGORITHMS, f"algorithm.name={name!r} is not an off-policy algorithm; choose one of {', '.join(ALGORITHMS)}")
    _require(m.kind == "mlp", f"actor.model.kind={m.kind!r}: the off-policy family trains MLP policies on flat observations; set mlp")
    _require(m.activation in ACTIVATIONS, f"actor.model.activation={m.activation!r} is unknown; choose one of {', '.join(ACTIVATIONS)}")
    _require(cfg.env.suite != "tabletop", "the off-policy family needs flat observations; the tabletop's are images")
    _require(m.compute_dtype in COMPUTE_DTYPES,
             f"actor.model.compute_dtype={m.compute_dtype!r} is unknown; choose one of {', '.join(COMPUTE_DTYPES)}")
    kernels.check_name(m.matmul)
    for key in ("utd_ratio", "batch_size", "num_q", "num_min_q", "policy_delay"):
        _require(getattr(a, key) >= 1, f"algorithm.offpolicy.{key}={getattr(a, key)} must be >= 1")
    _require(
        0 <= a.learning_starts <= a.replay_size,
        f"algorithm.offpolicy.learning_starts={a.learning_starts} must lie in [0, algorithm.offpolicy.replay_size={a.replay_size}]",
    )
    _require(a.num_min_q <= a.num_q, f"algorithm.offpolicy.num_min_q={a.num_min_q} must be <= algorithm.offpolicy.num_q={a.num_q}")
    _require(a.replay_size >= a.batch_size, f"algorithm.offpolicy.replay_size={a.replay_size} must be >= algorithm.offpolicy.batch_size={a.batch_size}")
    _require(a.replay_size >= cfg.env.num_envs, f"algorithm.offpolicy.replay_size={a.replay_size} must hold at least one transition per env ({cfg.env.num_envs})")
    _require(0 < a.tau <= 1, f"algorithm.offpolicy.tau={a.tau} must be in (0, 1]")
    _require(a.actor_q_reduce in ("min", "mean"), f"algorithm.offpolicy.actor_q_reduce={a.actor_q_reduce!r} must be min or mean")
    _require(math.isfinite(a.init_alpha) and a.init_alpha > 0, f"algorithm.offpolicy.init_alpha={a.init_alpha} must be > 0")
    _require(a.critic_norm in CRITIC_NORMS, f"algorithm.offpolicy.critic_norm={a.critic_norm!r} is unknown; choose one of {', '.join(CRITIC_NORMS)}")
    _require(0 < a.renorm_momentum < 1, f"algorithm.offpolicy.renorm_momentum={a.renorm_momentum} must be in (0, 1)")
    _require(a.renorm_warmup >= 0, f"algorithm.offpolicy.renorm_warmup={a.renorm_warmup} must be >= 0")
    if name == "crossq":
        _require(
            a.critic_norm == "batch_renorm",
            f"algorithm.name=crossq is SAC with batch renormalisation in the critic and no target network: set "
            f"algorithm.offpolicy.critic_norm=batch_renorm (got {a.critic_norm})",
        )
    elif a.critic_norm == "batch_renorm":
        raise BadInput(
            "algorithm.offpolicy.critic_norm=batch_renorm needs CrossQ's joint forward pass and no target network: "
            "set algorithm.name=crossq"
        )
    if name in WITH_DATA:
        _require(bool(a.demo_path), f"algorithm.name={name} learns from a dataset: set algorithm.offpolicy.demo_path to a transitions file (python -m rlinf_jax.collect)")
    _require(0 < a.demo_ratio < 1, f"algorithm.offpolicy.demo_ratio={a.demo_ratio} must be in (0, 1)")
    _require(0 < a.expectile < 1, f"algorithm.offpolicy.expectile={a.expectile} must be in (0, 1)")
    _require(math.isfinite(a.awr_temperature) and a.awr_temperature >= 0, f"algorithm.offpolicy.awr_temperature={a.awr_temperature} must be >= 0")
    _require(a.offline_iterations >= 0, f"algorithm.offpolicy.offline_iterations={a.offline_iterations} must be >= 0")
    _require(
        a.offline_iterations == 0 or name == "iql",
        f"algorithm.offpolicy.offline_iterations={a.offline_iterations}: only iql trains on the dataset alone",
    )
