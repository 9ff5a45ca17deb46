"""The typed config schema: one dataclass per section.

Every recipe in ``configs/`` is validated against these classes; a key that is not here
is a typo, and a value of the wrong type is rejected before anything runs. Later
workloads add sections (rollout, critic, reward, data) next to these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunnerConfig:
    output_dir: str = "runs"
    experiment_name: str = "ppo_brax_inverted_pendulum"
    seed: int = 0
    # Training iterations (one iteration = one rollout of the env batch + its PPO update).
    max_steps: int = 100
    # Iterations between checkpoints / evaluations; 0 disables (a final one still happens).
    save_interval: int = 50
    eval_interval: int = 25
    log_interval: int = 5
    # "none", "auto" (latest checkpoint of this run directory) or a checkpoint path.
    resume: str = "none"
    keep_checkpoints: int = 3
    # Stop with an error after this many iterations in a row with a skipped (non-finite) update.
    max_nonfinite_updates: int = 10
    progress_bar: bool = True
    tensorboard: bool = True
    # JAX's persistent compilation cache: a rerun or a resume loads its compiled programs
    # instead of compiling them again. "" turns it off.
    compilation_cache: str = "~/.cache/rlinf_jax/jax"


@dataclass
class EnvConfig:
    # "brax" (brax.envs) or "playground" (MuJoCo Playground dm_control suite).
    suite: str = "brax"
    name: str = "inverted_pendulum"
    # brax: mjx | generalized | positional | spring;  playground: jax | warp.
    backend: str = "positional"
    num_envs: int = 128
    episode_length: int = 1000
    action_repeat: int = 1
    num_eval_envs: int = 128
    # "cached": a finished env restarts from its own first state (Brax's way, cheap);
    # "fresh": it draws a new initial state with a new key.
    reset_mode: str = "cached"


@dataclass
class PolicyConfig:
    policy_hidden_sizes: list[int] = field(default_factory=lambda: [32, 32, 32, 32])
    value_hidden_sizes: list[int] = field(default_factory=lambda: [256, 256, 256, 256, 256])
    activation: str = "swish"
    # Initial std of the Gaussian policy is softplus(param) + min_std, as in Brax.
    min_std: float = 0.001
    init_log_std: float = 0.0


@dataclass
class OptimConfig:
    lr: float = 3e-4
    max_grad_norm: float = 1.0
    # "constant" or "linear" (decays to 0 at runner.max_steps).
    lr_schedule: str = "constant"


@dataclass
class ActorConfig:
    model: PolicyConfig = field(default_factory=PolicyConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class AlgorithmConfig:
    name: str = "ppo"
    adv_type: str = "gae"
    loss_type: str = "ppo"
    # Env steps per env per iteration (the rollout length T); GAE runs over all T.
    rollout_length: int = 80
    update_epochs: int = 4
    num_minibatches: int = 32
    gamma: float = 0.97
    gae_lambda: float = 0.95
    clip_eps: float = 0.3
    entropy_coef: float = 0.01
    value_coef: float = 0.5
    reward_scale: float = 10.0
    normalize_advantages: bool = True
    normalize_observations: bool = True
    # Bootstrap V(final observation) when an episode ends on a time limit.
    bootstrap_on_truncation: bool = True


@dataclass
class ClusterConfig:
    # Devices the run may use ("all" or a count), counted over all devices of all hosts.
    num_devices: str = "all"
    # Which devices each component runs on: a preset (collocated | disaggregated |
    # hybrid | auto) or RLinf's mapping, e.g. {env: 0-3, rollout: 4-7, actor: all}.
    component_placement: Any = "collocated"
    # Per-component mesh shape over its devices, e.g. {actor: {data: 2, fsdp: 2}};
    # a component not named gets {data: <its device count>}.
    mesh: dict[str, Any] = field(default_factory=dict)
    # Logical parameter axis -> mesh axis overrides, e.g. {mlp: fsdp}.
    partition_rules: dict[str, Any] = field(default_factory=dict)


@dataclass
class FlowConfig:
    # fused: the whole iteration is one jit per chunk (collocated, on-policy, one
    # micro-batch); staged: jitted stages on their components' meshes, linked by
    # channels; auto: fused where it applies, else staged.
    runner: str = "auto"
    # The env batch is cut into this many micro-batches that stream through env and
    # rollout, so that on disjoint devices one steps while the other infers.
    num_micro_batches: int = 1
    # How many policy versions the trajectories the actor trains on may lag behind it:
    # 0 = strictly on-policy; 1 lets the next rollout overlap the current update.
    max_staleness: int = 0
    # Park the actor's optimiser state in host memory (JAX memory kinds) while the
    # rollout runs; worth it when actor and rollout share devices and memory is tight.
    offload_optimizer: bool = False


@dataclass
class Config:
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
