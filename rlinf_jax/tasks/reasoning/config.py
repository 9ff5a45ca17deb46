"""What a reasoning run needs of its config beyond the schema: its components, and the
algorithms the flow can run."""

from __future__ import annotations

from rlinf_jax.algos import GROUP_ADVANTAGES, GROUP_OUTCOME_ADVANTAGES, TOKEN_ADVANTAGES
from rlinf_jax.algos import get_advantage, get_aggregation, get_kl, get_policy_loss
from rlinf_jax.config.reads import Reads
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.sharding import Placement, resolve_placement, with_phase
from rlinf_jax.tasks.sft import config as sft

POLICY_LOSSES = ("ppo", "dual_clip_ppo", "decoupled_ppo")
ADVANTAGES = (*GROUP_OUTCOME_ADVANTAGES, *TOKEN_ADVANTAGES, "gae")


def components(cfg: Config) -> tuple[str, ...]:
    """The device components of a reasoning run (the reward runs on the host)."""
    return ("rollout", "reference", "actor") if cfg.algorithm.lm.kl_coef > 0 else ("rollout", "actor")


def placement(cfg: Config, num_devices: int) -> Placement:
    """The run's placement; with cluster.scaling=dynamic, its ``update`` phase: the actor's
    devices plus every other component's, all idle while the actor learns. The rollout's
    copy of the weights is released during the update; the reference's frozen weights stay
    where they are, beside the update's share of the work on its chips (the planner counts
    them there)."""
    c = cfg.cluster
    names = components(cfg)
    out = resolve_placement(c.component_placement, names, num_devices, c.mesh)
    if c.scaling != "dynamic":
        return out
    return with_phase(out, "update", "actor", tuple(n for n in names if n != "actor"))


def check_algorithm(cfg: Config) -> None:
    """Algorithm names against the registry, and what this flow can run."""
    a = cfg.algorithm
    get_advantage(a.adv_type)
    get_policy_loss(a.loss_type)
    get_aggregation(a.lm.loss_agg)
    if a.lm.kl_coef > 0:
        get_kl(a.lm.kl_type)
    if a.adv_type not in ADVANTAGES:
        raise BadInput(
            f"algorithm.adv_type={a.adv_type!r} is registered but the reasoning flow does not know its inputs; "
            f"use one of {', '.join(ADVANTAGES)}"
        )
    if a.loss_type not in POLICY_LOSSES:
        raise BadInput(f"algorithm.loss_type={a.loss_type!r}: the reasoning flow runs {', '.join(POLICY_LOSSES)}")
    if a.lm.group_size < 2 and a.adv_type in GROUP_ADVANTAGES:
        raise BadInput(
            f"algorithm.adv_type={a.adv_type} compares the responses to one prompt and needs algorithm.lm.group_size >= 2"
        )
    if cfg.agent.enabled:
        cfg.agent.validate()
        if a.adv_type != "grpo":
            raise BadInput(
                f"agent.enabled runs multi-turn GRPO (grpo_dynamic, agent.advantage_mode); set algorithm.adv_type=grpo, "
                f"not {a.adv_type}"
            )
        if a.lm.dynamic_sampling or a.lm.kl_in_reward:
            raise BadInput("agent.enabled does not run algorithm.lm.dynamic_sampling or algorithm.lm.kl_in_reward; set them false")
    if a.lm.dynamic_sampling and a.adv_type not in GROUP_ADVANTAGES:
        raise BadInput(
            "algorithm.lm.dynamic_sampling keeps prompt groups whose rewards differ, which only matters to group "
            f"advantages ({', '.join(GROUP_ADVANTAGES)}), not adv_type={a.adv_type}"
        )


READS = {
    "runner.*", "cluster.*", "data.*", "reward.*", "rollout.*", *sft.LM_MODEL, *sft.LM_OPTIM,
    "actor.optim.critic_lr", "sft.warm_start_steps", "sft.lr", "sft.batch_size", "sft.train_levels", "agent.*",
} | {
    f"algorithm.{k}" for k in ("name", "adv_type", "loss_type", "update_epochs", "gamma", "gae_lambda",
                               "entropy_coef", "value_coef", "normalize_advantages", "lm.*")
}
HINTS = {
    "algorithm.clip_eps": "a reasoning run clips with algorithm.lm.clip_low and algorithm.lm.clip_high",
    "algorithm.rollout_length": "responses are rollout.max_new_tokens long at most",
    "algorithm.num_minibatches": "mini-batches are actor.global_batch_size responses",
    "algorithm.reward_scale": "rewards are reward.correct_reward / wrong_reward",
    "env.num_envs": "prompts per iteration are data.rollout_batch_size",
}


def reads(cfg: Config) -> Reads:
    return Reads(frozenset(READS), HINTS)


def check(cfg: Config) -> None:
    sft.check_lm(cfg)
    check_algorithm(cfg)
    d, a, actor = cfg.data, cfg.algorithm, cfg.actor
    samples = d.rollout_batch_size * a.lm.group_size
    if samples % actor.global_batch_size:
        raise BadInput(
            f"data.rollout_batch_size * algorithm.lm.group_size = {d.rollout_batch_size} * {a.lm.group_size} = {samples} "
            f"responses is not divisible by actor.global_batch_size={actor.global_batch_size}; each optimiser step "
            "takes a mini-batch of global_batch_size responses"
        )
