"""The config keys an sft run reads: a language model's, or a VLA's cloning keys."""

from __future__ import annotations

import importlib.util
import math

from rlinf_jax.config.reads import Reads
from rlinf_jax.config.schema import Config
from rlinf_jax.data.math_tasks import check_levels
from rlinf_jax.data.tokenizers import carried_tokenizer
from rlinf_jax.errors import BadInput
from rlinf_jax import kernels
from rlinf_jax.policies.lm import SUPPORTED_MODEL_TYPES
from rlinf_jax.policies.lm.hf_checkpoint import parse_dtype
from rlinf_jax.policies.lm.model import check_remat
from rlinf_jax.policies.lm.qlora import QTYPES
from rlinf_jax.tasks.embodied import config as embodied

# A language model, as a reasoning run reads it too.
LM_MODEL = {
    "actor.model.path", "actor.model.dtype", "actor.model.param_dtype", "actor.model.matmul",
    "actor.model.lora_rank", "actor.model.lora_alpha", "actor.model.base_qtype", "actor.model.logits_chunk",
    "actor.model.lm.vocab_size", "actor.model.lm.tie_word_embeddings", *embodied.LM_SIZES,
    "actor.model.scan_layers", "actor.model.remat",
}
LM_OPTIM = {
    "actor.optim.lr", "actor.optim.max_grad_norm", "actor.optim.lr_schedule", "actor.optim.warmup_steps",
    "actor.optim.weight_decay", "actor.global_batch_size", "actor.micro_batch_size",
}
LM_EVAL = {"rollout.max_new_tokens", "rollout.eval_temperature", "rollout.eval_batch_size", "rollout.top_p",
           "rollout.top_k", "reward.*"}
LM = {"runner.*", "cluster.*", "algorithm.name", *LM_MODEL, *LM_OPTIM, *LM_EVAL} | {
    f"data.{k}" for k in ("source", "train_path", "eval_path", "prompt_key", "answer_key", "train_levels",
                          "eval_levels", "heldout_fraction", "train_size", "eval_size", "reasoning_gym_task",
                          "template", "use_chat_template", "system_prompt", "seed", "shuffle", "tokenizer",
                          "max_prompt_length")
}
LM_HINTS = {
    "sft.lr": "an sft run learns at actor.optim.lr (sft.* configure the warm start of an RL run)",
    "sft.batch_size": "an sft run takes actor.global_batch_size examples per step",
    "sft.warm_start_steps": "an sft run trains for runner.max_steps steps",
    "data.rollout_batch_size": "an sft run takes actor.global_batch_size examples per step",
    "rollout.temperature": "an sft run samples only to evaluate, at rollout.eval_temperature",
}
# Cloning a VLA: the embodied run's env and model, the sft section's optimiser settings.
VLA = {
    "runner.*", "cluster.*", "algorithm.name", "algorithm.normalize_observations", "flow.runner",
    "actor.optim.max_grad_norm", "sft.lr", "sft.batch_size", "sft.num_demos", "sft.dagger_rounds",
    "sft.dagger_episodes", "sft.dagger_steps",
    *embodied.ENV, *embodied.TABLETOP, *embodied.MODELS["vla"],
}
VLA_HINTS = {
    "actor.optim.lr": "an sft run of a VLA clones at sft.lr",
    "sft.warm_start_steps": "an sft run of a VLA clones for runner.max_steps steps",
}
# Model kinds an sft run can train besides a language model (the default, kind=mlp: no
# embodied model is named).
KINDS = ("mlp", "vla")


def reads(cfg: Config) -> Reads:
    if cfg.actor.model.kind == "vla":
        return Reads(frozenset(VLA), VLA_HINTS)
    return Reads(frozenset(LM), LM_HINTS)


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise BadInput(msg)


def resolve_lm(cfg: Config, overridden: set[str]) -> None:
    """A model directory brings its own tokenizer: when ``actor.model.path`` is one that
    carries a tokenizer, ``data.tokenizer`` becomes that directory unless the command line
    set it (a recipe's ``char`` is the fresh tiny model's, and would feed a pretrained model
    ids it never learned). The resolved config, and so ``config.yaml``, records the choice."""
    if cfg.actor.model.kind == "vla" or "data.tokenizer" in overridden:
        return
    carried = carried_tokenizer(cfg.actor.model.path)
    if carried is not None:
        cfg.data.tokenizer = carried


def check_lm(cfg: Config) -> None:
    """The language-model sections of an sft or reasoning run."""
    m, actor, ro = cfg.actor.model, cfg.actor, cfg.rollout
    cfg.data.validate()
    cfg.reward.validate()
    for key in ("dtype", "param_dtype") if m.param_dtype else ("dtype",):
        try:
            parse_dtype(getattr(m, key))
        except BadInput as e:
            raise BadInput(f"actor.model.{key}: {e}") from None
    kernels.check_name(m.matmul)
    try:
        check_remat(m.remat)
    except BadInput as e:
        raise BadInput(f"actor.model.{e}") from None
    check_memory_remedies(m)
    _require(
        m.lm.model_type in SUPPORTED_MODEL_TYPES,
        f"actor.model.lm.model_type={m.lm.model_type!r} is unknown; choose one of {', '.join(SUPPORTED_MODEL_TYPES)}",
    )
    _require(
        m.lm.num_heads % m.lm.num_kv_heads == 0,
        f"actor.model.lm.num_heads={m.lm.num_heads} must be a multiple of lm.num_kv_heads={m.lm.num_kv_heads}",
    )
    _require(
        m.lm.hidden_size % m.lm.num_heads == 0 and (m.lm.hidden_size // m.lm.num_heads) % 2 == 0,
        f"actor.model.lm.hidden_size={m.lm.hidden_size} must split into lm.num_heads={m.lm.num_heads} heads "
        "of an even size",
    )
    for name in ("global_batch_size", "micro_batch_size"):
        _require(getattr(actor, name) >= 1, f"actor.{name}={getattr(actor, name)} must be >= 1")
    _require(
        actor.global_batch_size % actor.micro_batch_size == 0,
        f"actor.global_batch_size={actor.global_batch_size} is not divisible by actor.micro_batch_size="
        f"{actor.micro_batch_size}; the micro-batches of a step must fill it exactly",
    )
    _require(ro.max_new_tokens >= 1, f"rollout.max_new_tokens={ro.max_new_tokens} must be >= 1")
    for name in ("temperature", "eval_temperature"):
        v = getattr(ro, name)
        _require(math.isfinite(v) and v >= 0, f"rollout.{name}={v} must be >= 0 (0 = greedy)")
    _require(0 < ro.top_p <= 1, f"rollout.top_p={ro.top_p} must be in (0, 1]")
    _require(ro.top_k >= 0, f"rollout.top_k={ro.top_k} must be >= 0 (0 = off)")
    _require(ro.eval_batch_size >= 1, f"rollout.eval_batch_size={ro.eval_batch_size} must be >= 1")
    if cfg.sft.train_levels:
        check_levels(cfg.sft.train_levels)


def check_memory_remedies(m) -> None:
    """``actor.model.logits_chunk`` and ``base_qtype`` (QLoRA)."""
    _require(m.logits_chunk >= 0, f"actor.model.logits_chunk={m.logits_chunk} must be >= 0 (0 = the whole vocabulary)")
    _require(
        m.logits_chunk == 0 or m.matmul == "xla",
        f"actor.model.logits_chunk={m.logits_chunk} chunks XLA's output head; matmul={m.matmul} computes the log-probs "
        "in its own kernel: set logits_chunk=0 or matmul=xla",
    )
    _require(
        m.base_qtype in QTYPES, f"actor.model.base_qtype={m.base_qtype!r} is unknown; choose one of {', '.join(QTYPES)}"
    )
    if m.base_qtype != "none":
        _require(
            m.lora_rank > 0,
            f"actor.model.base_qtype={m.base_qtype} quantises the frozen base of a LoRA run (QLoRA); set "
            "actor.model.lora_rank > 0, or base_qtype=none for full fine-tuning",
        )
        _require(
            importlib.util.find_spec("qwix") is not None,
            f"actor.model.base_qtype={m.base_qtype} needs qwix: pip install -e \".[qlora]\"",
        )


def check(cfg: Config) -> None:
    kind = cfg.actor.model.kind
    if kind not in KINDS:
        raise BadInput(
            f"runner.task=sft trains a language model or clones a VLA (actor.model.kind=vla), not "
            f"actor.model.kind={kind}; pi0 warm-starts inside its RL run (sft.warm_start_steps)"
        )
    if kind == "vla":
        embodied.check(cfg)
    else:
        check_lm(cfg)
