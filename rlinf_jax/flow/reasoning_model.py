"""The language model of an sft / reasoning run, its tokenizer, and the token maths both
trainers share.

Where the weights come from (``actor.model.path``):

- ``""``: a fresh model of the ``actor.model.lm_*`` sizes (the offline tiny character model);
- a run folder or checkpoint of an sft / reasoning run: its policy parameters, with the
  architecture read from the checkpoint's metadata (``lm_config``);
- a converted directory (``config.json`` + ``params/``) or a Hugging Face directory
  (``config.json`` + safetensors).

Sequences are laid out as ``[prompt | response]``: the prompt left-padded to a width ``P``
(a sampler bucket), the response right-padded to ``N`` tokens with a mask. Response token
``j`` sits at column ``P + j`` and is predicted by the hidden state at ``P + j - 1``, so the
logits (and the value head) only ever run on the ``N`` columns ``P - 1 .. P + N - 2``: for a
150k vocabulary the output projection of the prompt would be most of the work.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.config.schema import Config, PolicyConfig
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import CausalLM, LMConfig
from rlinf_jax.policies.lm.hf_checkpoint import (
    abstract_model,
    dotted,
    fill_model,
    flatten_tree,
    parse_dtype,
)

# Checkpoint metadata key holding the model's Hugging Face config dict.
LM_CONFIG_KEY = "lm_config"


# ----------------------------------------------------------------------------- models


def lm_config_from(m: PolicyConfig) -> LMConfig:
    """The architecture of a fresh model from ``actor.model.lm_*``, read as a Hugging Face
    config would be (so a family's fixed switches, e.g. Qwen2's q/k/v biases, hold and the
    checkpoint's ``lm_config`` reads back to the same model)."""
    return LMConfig.from_hf_config({
        "model_type": m.lm_model_type,
        "vocab_size": m.lm_vocab_size,
        "hidden_size": m.lm_hidden_size,
        "intermediate_size": m.lm_intermediate_size,
        "num_hidden_layers": m.lm_num_layers,
        "num_attention_heads": m.lm_num_heads,
        "num_key_value_heads": m.lm_num_kv_heads,
        "head_dim": m.lm_hidden_size // m.lm_num_heads,
        "tie_word_embeddings": m.lm_tie_word_embeddings,
        "max_position_embeddings": m.lm_max_position_embeddings,
        "rms_norm_eps": 1e-6,
    })


@dataclasses.dataclass
class LoadedLM:
    model: CausalLM
    source: str  # where the weights came from, for people


def _is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def load_policy(cfg: Config, seed: int | None = None) -> LoadedLM:
    """The model ``actor.model`` describes, on the default device (callers lay it out)."""
    m = cfg.actor.model
    dtype = parse_dtype(m.dtype)
    if not m.path:
        seed = cfg.runner.seed if seed is None else seed
        model = CausalLM(lm_config_from(m), dtype=dtype, rngs=nnx.Rngs(seed))
        return LoadedLM(model, f"fresh {m.lm_model_type} model (seed {seed})")
    path = Path(m.path)
    if not path.exists():
        # Checked here rather than when the config loads, so recipes can name a model
        # directory that only exists on the machine that trains.
        raise BadInput(
            f"actor.model.path={m.path!r}: no such path; give a run folder, a checkpoint, a Hugging Face model "
            'directory or a converted directory, or "" for a fresh tiny model'
        )
    if path.is_dir() and _is_hf_dir(path):
        from rlinf_jax.policies.lm import from_pretrained, load_converted

        if (path / "params").is_dir():
            return LoadedLM(load_converted(path, dtype=dtype), f"converted model {path}")
        return LoadedLM(from_pretrained(path, dtype=dtype), f"Hugging Face model {path}")
    model, point = load_checkpoint_policy(path, dtype)
    return LoadedLM(model, f"checkpoint {point.path}")


def load_checkpoint_policy(path, dtype=None):
    """The policy of an sft / reasoning run's checkpoint (run folder, checkpoints folder or
    step folder); returns ``(model, ResumePoint)``."""
    from rlinf_jax.runtime import Checkpointer, find_checkpoint

    point = find_checkpoint(path, "actor.model.path")
    state, meta = Checkpointer(point.directory).restore(point.step, None)
    hf = meta.get(LM_CONFIG_KEY)
    if not isinstance(hf, dict) or not isinstance(state, dict) or "params" not in state:
        raise BadInput(
            f"checkpoint {point.path} holds no language model (no {LM_CONFIG_KEY} in its metadata); "
            "point actor.model.path at an sft or reasoning run, or a Hugging Face model directory"
        )
    config = LMConfig.from_hf_config(hf)
    policy = state["params"].get("policy", state["params"])  # {"policy", "value", "lora"} in LM runs
    # A saved nnx.State names each array ``<path>.value`` (the Variable's field).
    stored = {k.removesuffix(".value"): v for k, v in flatten_tree(policy).items()}
    if "lora" in state["params"] and "lora" in meta:
        from rlinf_jax.flow.reasoning_lora import merge_host

        stored = merge_host(stored, flatten_tree(state["params"]["lora"]), meta["lora"])
    dtype = parse_dtype(dtype) if dtype is not None else jnp.dtype(next(iter(stored.values())).dtype)
    graphdef, abstract = nnx.split(abstract_model(config, dtype, dtype))
    wanted = {dotted(p) for p, _ in nnx.to_flat_state(abstract)}
    if set(stored) != wanted:
        missing = sorted(wanted - set(stored))[:3]
        raise BadInput(f"checkpoint {point.path} does not match its lm_config (missing {', '.join(missing)})")
    values = {k: jnp.asarray(v, dtype) for k, v in stored.items()}
    return fill_model(graphdef, abstract, values), point


def checkpoint_meta(model: CausalLM, tokenizer_spec: str) -> dict:
    """What an LM checkpoint's metadata needs so that a later run can load its policy."""
    return {LM_CONFIG_KEY: model.config.to_hf_config(jnp.dtype(model.param_dtype).name), "tokenizer": tokenizer_spec}


class ValueHead(nnx.Module):
    """A scalar per position from the LM's final hidden states (PPO's value model)."""

    def __init__(self, hidden_size: int, *, rngs: nnx.Rngs):
        self.kernel = nnx.Param(jnp.zeros((hidden_size, 1), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((1,), jnp.float32))
        del rngs  # zero init: the first values are 0 and the first advantages the returns

    def __call__(self, hidden):
        return (hidden.astype(jnp.float32) @ self.kernel[...] + self.bias[...])[..., 0]


class ValueModel(nnx.Module):
    """A causal LM trunk with a value head: V(prompt + response[:j]) for every j."""

    def __init__(self, trunk: CausalLM, *, rngs: nnx.Rngs):
        self.trunk = trunk
        self.head = ValueHead(trunk.config.hidden_size, rngs=rngs)


# ----------------------------------------------------------------------------- tokens


def load_run_tokenizer(cfg: Config, vocab_size: int | None = None):
    """``data.tokenizer``: the character tokenizer (``char``) or a model directory's."""
    from rlinf_jax.data import get_tokenizer

    tok = get_tokenizer(cfg.data.tokenizer)
    if vocab_size is not None and len(tok) > vocab_size:
        raise BadInput(
            f"the tokenizer ({cfg.data.tokenizer}) has {len(tok)} ids but the model's vocabulary holds {vocab_size}; "
            "use the model's own tokenizer (data.tokenizer) or a larger actor.model.lm_vocab_size"
        )
    return tok


def stop_tokens(tokenizer) -> tuple[int, ...]:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise BadInput("the tokenizer has no end-of-sequence token; generation would never stop")
    return (int(eos),)


def pad_id(tokenizer) -> int:
    pid = tokenizer.pad_token_id
    return int(tokenizer.eos_token_id if pid is None else pid)


def bucket(n: int, minimum: int = 8) -> int:
    from rlinf_jax.rollout.sampler import bucket_length

    return bucket_length(n, minimum)


class PromptEncoder:
    """Prompts -> left-padded ids of a sampler bucket width (``[B, P]``, mask)."""

    def __init__(self, cfg: Config, tokenizer):
        from rlinf_jax.data import PromptTemplate

        d = cfg.data
        self.tokenizer = tokenizer
        self.template = PromptTemplate(d.template, d.use_chat_template, d.system_prompt, tokenizer)
        self.max_len = d.max_prompt_length
        self.pad_id = pad_id(tokenizer)

    def encode(self, prompts, ids=None) -> list[list[int]]:
        out = []
        for i, prompt in enumerate(prompts):
            chat = self.template.use_chat_template or not isinstance(prompt, str)
            text = self.template.render(prompt)
            # A chat-rendered text already holds the model's start and turn tokens.
            toks = list(self.tokenizer.encode(text, add_special_tokens=not chat))
            if len(toks) > self.max_len:
                name = f" {ids[i]!r}" if ids is not None else ""
                raise BadInput(
                    f"prompt{name} has {len(toks)} tokens, more than data.max_prompt_length={self.max_len}; "
                    "raise data.max_prompt_length or shorten the prompt"
                )
            out.append(toks)
        return out

    def pad(self, seqs: list[list[int]], width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        width = bucket(max(map(len, seqs))) if width is None else width
        ids = np.full((len(seqs), width), self.pad_id, np.int32)
        mask = np.zeros((len(seqs), width), np.int32)
        for r, s in enumerate(seqs):
            ids[r, width - len(s) :] = s
            mask[r, width - len(s) :] = 1
        return ids, mask

    def __call__(self, prompts, ids=None, width: int | None = None):
        return self.pad(self.encode(prompts, ids), width)


def encode_targets(tokenizer, targets, width: int) -> tuple[np.ndarray, np.ndarray]:
    """SFT targets + end token, right-padded to ``width`` (``[B, N]`` ids, mask); a target
    longer than ``width`` is an error, not a silently truncated answer."""
    eos, pad = stop_tokens(tokenizer)[0], pad_id(tokenizer)
    ids = np.full((len(targets), width), pad, np.int32)
    mask = np.zeros((len(targets), width), np.int32)
    for r, t in enumerate(targets):
        toks = [*tokenizer.encode(t, add_special_tokens=False), eos]
        if len(toks) > width:
            raise BadInput(
                f"the SFT target {t!r} takes {len(toks)} tokens with its end token, more than "
                f"rollout.max_new_tokens={width}; raise rollout.max_new_tokens"
            )
        ids[r, : len(toks)] = toks
        mask[r, : len(toks)] = 1
    return ids, mask


def decode_responses(tokenizer, tokens, mask) -> list[str]:
    """Response texts (special tokens dropped) of ``tokens [B, N]`` under ``mask``."""
    tokens, mask = np.asarray(tokens), np.asarray(mask).astype(bool)
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(tokens, mask)]


# ----------------------------------------------------------------------------- maths


def response_hidden(model: CausalLM, prompt_ids, prompt_mask, tokens, response_mask):
    """Final hidden states ``[B, N, embed]`` at the columns that predict each response token.

    Column ``P - 1 + t`` predicts response token ``t``. The last response token predicts
    nothing scored and, by causality, no scored column sees it, so it is left out of the
    input; the model's last layer runs only on the ``N`` scored columns (``output_cols``).
    """
    P, N = prompt_ids.shape[1], tokens.shape[1]
    ids = jnp.concatenate([prompt_ids, tokens[:, :-1]], axis=1)
    mask = jnp.concatenate([prompt_mask, response_mask[:, :-1]], axis=1).astype(jnp.int32)
    return model.hidden_states(ids, mask, output_cols=(P - 1, N))


def token_logprobs(logits, tokens, temperature: float = 1.0):
    """``(log pi(token), entropy)`` per position, ``[B, N]`` each, of ``softmax(logits / T)``.

    The temperature is the sampler's: its log-probs are those of the scaled distribution.
    """
    scaled = logits / temperature if temperature not in (0.0, 1.0) else logits
    logp_all = jax.nn.log_softmax(scaled, axis=-1)
    logp = jnp.take_along_axis(logp_all, tokens[..., None], axis=-1)[..., 0]
    p = jnp.exp(logp_all)
    entropy = -jnp.sum(jnp.where(p > 0, p * logp_all, 0.0), axis=-1)
    return logp, entropy


def policy_logprobs(model: CausalLM, batch: dict, temperature: float = 1.0):
    """``(logp, entropy)`` ``[B, N]`` of the batch's response tokens under ``model``."""
    h = response_hidden(model, batch["prompt_ids"], batch["prompt_mask"], batch["tokens"], batch["response_mask"])
    return token_logprobs(model.logits(h), batch["tokens"], temperature)


def values_of(value_model: ValueModel, batch: dict):
    """V before each response token, ``[B, N]`` (float32)."""
    h = response_hidden(
        value_model.trunk, batch["prompt_ids"], batch["prompt_mask"], batch["tokens"], batch["response_mask"]
    )
    return value_model.head(h)


def make_optimizer(lr: float, max_grad_norm: float, weight_decay: float, warmup_steps: int,
                   schedule: str = "constant", total_steps: int = 1):
    """Global-norm clipping + AdamW with an optional linear warm-up and linear decay."""
    import optax

    decay_steps = max(int(total_steps) - int(warmup_steps), 1)
    tail = optax.linear_schedule(lr, 0.0, decay_steps) if schedule == "linear" else optax.constant_schedule(lr)
    sched = optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps), tail], [warmup_steps]) if warmup_steps else tail
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adamw(sched, weight_decay=weight_decay)), sched


def chunked(fn, batch: dict, chunk: int):
    """``fn(batch)`` evaluated ``chunk`` rows at a time (``lax.map``), to bound activation
    memory of a forward pass over a whole rollout batch; outputs concatenated."""
    B = next(iter(batch.values())).shape[0]
    if chunk >= B or B % chunk:
        return fn(batch)
    parts = jax.tree.map(lambda x: x.reshape(B // chunk, chunk, *x.shape[1:]), batch)
    out = jax.lax.map(fn, parts)
    return jax.tree.map(lambda x: x.reshape(B, *x.shape[2:]), out)


def finite(tree) -> jax.Array:
    """True when every leaf of ``tree`` is finite."""
    return jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def select(pred, new, old):
    """``new`` where ``pred`` else ``old``, leaf by leaf (a skipped update keeps ``old``)."""
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def place_rows(tree, mesh, rows: int):
    """Leaves with ``rows`` leading rows split over the mesh's batch axes when they divide,
    the rest replicated."""
    from rlinf_jax.sharding import batch_divisor, batch_sharding, replicated
    from rlinf_jax.sharding.mesh import put

    split = rows % batch_divisor(mesh) == 0
    bs, rep = batch_sharding(mesh), replicated(mesh)
    return jax.tree.map(lambda x: put(x, bs if split and np.ndim(x) and np.shape(x)[0] == rows else rep), tree)


def make_sampler(model: CausalLM, pad: int, mesh, rules):
    """The run's `Sampler` on ``mesh``, its weights laid out from the host.

    In a multi-host job the model's arrays are this process's own copies; placed through
    `put`, each process fills its shards, where the sampler's own placement would first
    compare every weight across all processes.
    """
    from rlinf_jax.rollout.sampler import Sampler
    from rlinf_jax.runtime.distributed import is_multiprocess
    from rlinf_jax.sharding import param_shardings
    from rlinf_jax.sharding.mesh import put

    if is_multiprocess():
        graphdef, params = nnx.split(model)
        model = nnx.merge(graphdef, put(params, param_shardings(params, mesh, rules)))
    return Sampler(model, pad_id=pad, mesh=mesh, rules=rules)


def sync_sampler(sampler, weights) -> None:
    """Weight sync: ``weights`` (the actor's) onto the sampler's layout, also across hosts."""
    from rlinf_jax.runtime.distributed import is_multiprocess
    from rlinf_jax.sharding.mesh import put

    if is_multiprocess() and sampler.param_shardings is not None:
        # A device-to-device copy cannot leave a host; `put` goes through the hosts there.
        weights = put(weights, sampler.param_shardings)
    sampler.set_params(weights)


def state_shardings(tree, mesh, rules):
    """`param_shardings` for optimiser states too: a leaf whose annotation does not fit its
    shape (the empty placeholders ``optax.multi_transform`` keeps for another partition's
    parameters) falls back to the size-based default rule."""
    from flax import nnx as _nnx
    from jax.sharding import NamedSharding

    from rlinf_jax.sharding.partition import default_spec, logical_to_spec

    def one(leaf):
        if isinstance(leaf, _nnx.Variable):
            if not hasattr(leaf.get_value(), "shape"):
                return leaf  # an optax MaskedNode: no array, nothing to place
            names = leaf.get_metadata().get("out_sharding")
            shape = np.shape(leaf.get_value())
            if names and len(names) == len(shape) and all(shape):
                spec = logical_to_spec(names, mesh, rules, shape)
            else:
                spec = default_spec(shape, mesh)
            return leaf.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, default_spec(np.shape(leaf), mesh))

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, _nnx.Variable))
