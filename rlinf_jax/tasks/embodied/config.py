"""The config keys an embodied run reads, by env suite and model kind, and the checks only
this task can make."""

from __future__ import annotations

from rlinf_jax.config.reads import Reads
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.embodied import POLICIES
from rlinf_jax.policies.mlp import ACTIVATIONS
from rlinf_jax.tasks.env_rl.keys import COMPUTE_DTYPES, ENV, HOST

COMMON = {"runner.*", "cluster.*", "algorithm.name", "flow.*"}
TABLETOP = {"env.chunk_length", "env.image_size", "env.group_size", "env.layout", "env.terminate_on_success"}
PPO = {
    "algorithm.adv_type", "algorithm.loss_type", "algorithm.rollout_length", "algorithm.update_epochs",
    "algorithm.num_minibatches", "algorithm.gamma", "algorithm.gae_lambda", "algorithm.clip_eps",
    "algorithm.entropy_coef", "algorithm.value_coef", "algorithm.reward_scale", "algorithm.normalize_advantages",
    "algorithm.normalize_observations", "algorithm.bootstrap_on_truncation",
    "actor.optim.lr", "actor.optim.max_grad_norm", "actor.optim.lr_schedule",
}
LM_SIZES = {
    f"actor.model.lm.{k}"
    for k in ("model_type", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
              "max_position_embeddings")
}
# A VLA's published architecture by name, and how its blocks are laid out and rematerialised.
LAYOUT = {"actor.model.architecture", "actor.model.scan_layers", "actor.model.remat"}
TOWER = {f"actor.model.vla.{k}" for k in ("patch_size", "vision_hidden_size", "vision_layers", "vision_heads")}
MODELS = {
    "mlp": {
        "actor.model.kind", "actor.model.policy_hidden_sizes", "actor.model.value_hidden_sizes",
        "actor.model.activation", "actor.model.min_std", "actor.model.init_log_std", "actor.model.compute_dtype",
    },
    "vla": {
        "actor.model.kind", "actor.model.dtype", "actor.model.path", "actor.model.vla.n_bins",
        "actor.model.vla.temperature", "actor.model.vla.logprob_level", *LAYOUT, *LM_SIZES, *TOWER,
    },
    "pi0": {"actor.model.kind", "actor.model.dtype", "actor.model.vla.logprob_level", *LAYOUT, *LM_SIZES, *TOWER} | {
        f"actor.model.pi0.{k}" for k in ("expert_hidden_size", "expert_intermediate_size", "num_steps", "method",
                                         "noise_level", "temperature")
    },
}
MODELS["pi05"] = MODELS["pi0"] | {"actor.model.pi0.state_bins"}  # sized and sampled as pi0, its state in bins
MODELS["gr00t"] = MODELS["pi0"]
# The warm start of a VLA or pi0 (behaviour cloning / flow matching on the scripted expert).
CLONING = {"sft.warm_start_steps", "sft.lr", "sft.batch_size", "sft.num_demos"}
DAGGER = {f"sft.{k}" for k in ("dagger_rounds", "dagger_episodes", "dagger_steps")}
CRITIC_WARMUP = {"sft.critic_warmup_steps", "sft.critic_warmup_episodes"}
# The backbone each model kind is built on; actor.model.lm.model_type may only name it.
BACKBONES = {"vla": "llama", "pi0": "gemma", "pi05": "gemma", "gr00t": "qwen3"}
FLOW_KINDS = ("pi0", "pi05", "gr00t")  # flow-matching VLAs: chunk log-probs from denoising chains

HINTS = {
    "algorithm.lm.clip_low": "the embodied PPO clips both sides with algorithm.clip_eps",
    "algorithm.lm.clip_high": "the embodied PPO clips both sides with algorithm.clip_eps",
    "algorithm.lm.group_size": "groups of envs sharing an episode are env.group_size",
    "actor.optim.warmup_steps": "the embodied optimiser has no warm-up (actor.optim.lr_schedule decays it)",
    "actor.global_batch_size": "minibatches are algorithm.num_minibatches of the rollout",
    "actor.micro_batch_size": "minibatches are algorithm.num_minibatches of the rollout",
}


def reads(cfg: Config) -> Reads:
    kind = cfg.actor.model.kind
    keys = COMMON | ENV | PPO | MODELS.get(kind, MODELS["mlp"])
    if cfg.env.suite == "tabletop":
        keys |= TABLETOP
    if cfg.env.suite == "gym":
        keys |= HOST
        if cfg.env.camera:
            keys |= {"env.image_size"}
    if kind == "vla" or kind in FLOW_KINDS:
        keys |= CLONING | CRITIC_WARMUP
    if kind == "vla":
        keys |= DAGGER
    return Reads(frozenset(keys), HINTS)


# Compute dtypes of the VLA backbone (its parameters stay float32).
VLA_DTYPES = ("float32", "bfloat16")
# The control MLP's compute dtypes (actor.model.compute_dtype).


def check(cfg: Config) -> None:
    e, a, m = cfg.env, cfg.algorithm, cfg.actor.model
    batch = e.num_envs * a.rollout_length
    if batch % a.num_minibatches:
        fits = [d for d in range(1, min(batch, 4 * a.num_minibatches) + 1) if batch % d == 0]
        nearest = min(fits, key=lambda d: (abs(d - a.num_minibatches), d))
        raise BadInput(
            f"env.num_envs * algorithm.rollout_length = {e.num_envs} * {a.rollout_length} = {batch} is not divisible "
            f"by algorithm.num_minibatches={a.num_minibatches}; e.g. set algorithm.num_minibatches={nearest}"
        )
    if m.kind not in POLICIES:
        raise BadInput(f"actor.model.kind={m.kind!r} is unknown; choose {', '.join(POLICIES)}")
    if m.kind == "mlp" and m.activation not in ACTIVATIONS:
        raise BadInput(f"actor.model.activation={m.activation!r} is unknown; choose one of {', '.join(ACTIVATIONS)}")
    if m.kind == "mlp" and m.compute_dtype not in COMPUTE_DTYPES:
        raise BadInput(f"actor.model.compute_dtype={m.compute_dtype!r} is unknown; choose one of "
                       f"{', '.join(COMPUTE_DTYPES)}")
    if m.kind == "vla" and m.dtype not in VLA_DTYPES:
        raise BadInput(f"actor.model.dtype={m.dtype!r} is unknown for a VLA; choose one of {', '.join(VLA_DTYPES)}")
    if m.kind in FLOW_KINDS and m.vla.logprob_level != "chunk":
        raise BadInput(
            f"actor.model.vla.logprob_level={m.vla.logprob_level} applies to kind=vla; {m.kind}'s log-prob is per "
            "chunk: set it to chunk"
        )
    if e.suite == "gym" and e.camera and m.kind != "vla":
        raise BadInput(
            f"env.camera={e.camera} gives image, instruction and proprio observations; actor.model.kind={m.kind} "
            "does not take them on a host simulator: set actor.model.kind=vla (or env.camera='' for state only)"
        )
    backbone = BACKBONES.get(m.kind)
    if backbone is not None and m.lm.model_type != backbone:
        raise BadInput(
            f"actor.model.lm.model_type={m.lm.model_type}: an actor.model.kind={m.kind} policy is built on a "
            f"{backbone} backbone; set it to {backbone}"
        )
