#!/usr/bin/env python
"""GRPO step time: our reasoning flow vs. Tunix's ``GRPOLearner`` (Google's JAX library).

Tunix is the JAX post-training library a user of this project would otherwise pick. Both
sides load the same Hugging Face directory (the tiny ~2.9M-parameter Qwen2 of ``grpo_math``,
safetensors, with a character-level ``tokenizer.json`` that encodes exactly like our
``CharTokenizer``): ours through ``actor.model.path``, Tunix's through its own Qwen2
safetensors loader. They train on the same prompts (procedural single-digit sums) with the
same reward function and settings:

    prompts x generations x new tokens   8 x 4 x 32 per step (--prompts-per-step --generations --new-tokens)
    sampling                             temperature 1, no top-k / top-p, stop at the end token
    advantages                           GRPO: (r - group mean) / group std
    loss                                 PPO-clip 0.2 / 0.2, token mean over the batch
    KL                                   none (beta 0; Tunix then runs no reference pass)
    optimiser                            AdamW, lr 5e-5 constant, grad clip 1.0, no weight decay
    update                               one optimiser step per generation batch (on-policy)

Tunix runs on its "vanilla" rollout engine (its own JAX sampler with a static KV cache; the
vLLM and SGLang engines need a GPU or TPU), collocated with the trainer on one device.

Each side runs in its own process, pinned to the same CPU core with one XLA thread
(``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``). Tunix runs in its
own virtual environment: google-tunix 0.1.7 requires ``safetensors<0.8`` and this project
``>=0.8``. The script uses ``--tunix-python`` (or ``$TUNIX_PYTHON``) when given; otherwise it
builds ``~/.cache/rlinf_jax/tunix-venv`` on first use (google-tunix with the same jax and
jaxlib versions as ours, so both sides compile with the same XLA) and says so. Seconds per
step are the median over the steps after ``--warmup``; a Tunix step is timed around its
learner's global step (generation, reward, advantages, update).

The last line of stdout is one JSON object with the figures and ``ratio`` = Tunix's seconds
per step over ours (higher is better for us).

    python benchmarks/grpo_vs_tunix.py [--steps 12] [--warmup 2] [--tunix-python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grpo_common import add_arguments, check_arguments, make_checkpoint, make_prompts, pin_one_cpu, run_ours, run_rounds, summarise
from recorded import warn_regressions

TUNIX_VERSION = "0.1.7"
DEFAULT_VENV = Path.home() / ".cache" / "rlinf_jax" / "tunix-venv"
REPO = Path(__file__).resolve().parent.parent
# Token ids both sides run through their model before training (digits, operators, letters of
# the character vocabulary), to show they loaded the same weights.
PROBE_IDS = list(range(4, 36))
# The logits both sides report for them: every column of a small vocabulary, every
# (vocab // PROBE_COLUMNS)-th of a large one (0.5B: 151,936 columns, ~4,000 kept), so the
# check spans the whole head without shipping ~5M numbers between processes.
PROBE_COLUMNS = 4096


def probe_columns(logits):
    return logits[:, :: max(1, logits.shape[-1] // PROBE_COLUMNS)]


# ----------------------------------------------------------------------------- Tunix's environment


def has_tunix(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import tunix.rl.grpo.grpo_learner"], capture_output=True, check=False)
    return probe.returncode == 0


def tunix_python(explicit: str | None) -> str:
    """The interpreter of an environment with google-tunix, built on first use."""
    if explicit:
        if not has_tunix(explicit):
            sys.exit(f"error: {explicit} cannot import tunix; install google-tunix=={TUNIX_VERSION} there "
                     "or leave --tunix-python out to have this script build its own environment")
        return explicit
    python = DEFAULT_VENV / "bin" / "python"
    if python.exists() and has_tunix(str(python)):
        print(f"Tunix environment: {DEFAULT_VENV}", flush=True)
        return str(python)
    import jax

    print(f"building Tunix's virtual environment at {DEFAULT_VENV} (google-tunix {TUNIX_VERSION} pins "
          f"safetensors<0.8, this project >=0.8; jax {jax.__version__} as ours) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(DEFAULT_VENV)], check=True)
    # pip's own output goes to a log beside the environment; a failure points at it.
    log = DEFAULT_VENV / "install.log"
    with open(log, "w") as out:
        pip = subprocess.run([str(python), "-m", "pip", "install", f"google-tunix=={TUNIX_VERSION}",
                              f"jax=={jax.__version__}", f"jaxlib=={jax.__version__}"],
                             stdout=out, stderr=subprocess.STDOUT, check=False)
    if pip.returncode != 0 or not has_tunix(str(python)):
        sys.exit(f"error: could not install google-tunix=={TUNIX_VERSION} into {DEFAULT_VENV} (pip's output: "
                 f"{log}); install it into an environment yourself and pass --tunix-python")
    return str(python)


# ----------------------------------------------------------------------------- Tunix's side


def run_tunix(args) -> dict:
    """Runs inside Tunix's environment: only Tunix, its dependencies and our reward package
    (plain Python, found through the repository root) are imported."""
    sys.path.insert(0, str(REPO))
    import jax
    import numpy as np
    import optax
    from transformers import PreTrainedTokenizerFast
    from tunix.models.qwen2 import model as qwen2
    from tunix.models.qwen2 import params as qwen2_params
    from tunix.rl import rl_cluster as rlc
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    from rlinf_jax.rewards import RewardConfig, RewardFunction

    hf = json.loads((Path(args.model) / "config.json").read_text())
    rope = hf.get("rope_parameters", {}).get("rope_theta", hf.get("rope_theta", 10000.0))
    cfg = qwen2.ModelConfig(
        num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"],
        head_dim=hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"]),
        num_kv_heads=hf["num_key_value_heads"], rope_theta=int(rope), norm_eps=hf["rms_norm_eps"],
        use_tied_embedding=hf["tie_word_embeddings"],
    )
    # Auto axes: Tunix's Qwen2 shards with logical rules, which explicit-axis meshes refuse.
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    model = qwen2_params.create_model_from_safe_tensors(args.model, cfg, mesh)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.model)
    ids = jax.numpy.asarray([PROBE_IDS])
    causal = jax.numpy.tril(jax.numpy.ones((1, len(PROBE_IDS), len(PROBE_IDS)), bool))
    probe_logits, _ = model(ids, jax.numpy.arange(len(PROBE_IDS))[None], None, causal)

    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines()]
    per = args.prompts_per_step
    batches = [{"prompts": np.array([r["prompt"] for r in rows[i : i + per]]),
                "answer": np.array([r["answer"] for r in rows[i : i + per]])}
               for i in range(0, per * args.steps, per)]
    longest_prompt = max(len(tokenizer.encode(r["prompt"])) for r in rows)

    checker = RewardFunction(RewardConfig(num_workers=0))
    rewards = []

    def reward(prompts, completions, answer, **_):
        values = [float(x) for x in checker(list(completions), list(answer)).rewards]
        rewards.append(float(np.mean(values)))
        return values

    training = rlc.RLTrainingConfig(
        actor_optimizer=optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(args.lr, weight_decay=0.0)),
        eval_every_n_steps=10**9, max_steps=args.steps,
    )
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=args.new_tokens, max_prompt_length=longest_prompt,
        kv_cache_size=longest_prompt + args.new_tokens, temperature=1.0, top_p=1.0, top_k=None,
    )
    roles = {rlc.Role.ACTOR: mesh, rlc.Role.REFERENCE: mesh, rlc.Role.ROLLOUT: mesh}
    cluster = rlc.RLCluster(actor=model, reference=None, tokenizer=tokenizer, cluster_config=rlc.ClusterConfig(
        role_to_mesh=roles, rollout_engine="vanilla", offload_to_cpu=False,
        training_config=training, rollout_config=rollout))
    algo = grpo_learner.GRPOConfig(num_generations=args.generations, num_iterations=1, beta=0.0,
                                   epsilon=0.2, loss_agg_mode="token-mean")
    learner = grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=reward)

    lengths = []
    buffer_metrics = cluster.buffer_metrics

    def keep_lengths(metrics, mode=rlc.Mode.TRAIN):
        if "completions/mean_length" in metrics:
            lengths.append(float(metrics["completions/mean_length"][0]))
        return buffer_metrics(metrics, mode=mode)

    cluster.buffer_metrics = keep_lengths
    times = []
    global_step = learner._run_global_step

    def timed_step(*a, **k):
        t0 = time.perf_counter()
        global_step(*a, **k)
        times.append(time.perf_counter() - t0)

    learner._run_global_step = timed_step
    learner.train(batches)
    return {"step_sec": times, "reward": rewards, "response_length": lengths, "jax": jax.__version__,
            "probe_logits": probe_columns(np.asarray(probe_logits[0])).tolist()}


def probe_ours(args) -> list:
    """Our model's logits of ``PROBE_IDS``, loaded from the same directory Tunix reads."""
    import numpy as np

    from rlinf_jax.policies.lm import from_pretrained

    return probe_columns(np.asarray(from_pretrained(args.model)(np.asarray([PROBE_IDS]))[0])).tolist()


# ----------------------------------------------------------------------------- driver


def child(args) -> None:
    cpu = pin_one_cpu()
    if args.side == "tunix":
        out = run_tunix(args)
    else:
        out = run_ours(args)
        out["probe_logits"] = probe_ours(args)
    out["cpu"] = cpu
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--tunix-python", default=os.environ.get("TUNIX_PYTHON"),
                   help="interpreter of an environment with google-tunix (default: build one under ~/.cache)")
    p.add_argument("--side", choices=("tunix", "ours"), help=argparse.SUPPRESS)
    args = p.parse_args()
    check_arguments(p, args)
    if args.side:
        child(args)
        return
    python = tunix_python(args.tunix_python)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"warm start: {args.warm_start_steps} SFT steps ...", flush=True)
        model = make_checkpoint(work, args.warm_start_steps, args.size)
        prompts = make_prompts(work, max(512, args.prompts_per_step * args.steps))
        results = run_rounds({"ours": sys.executable, "tunix": python}, args, model, prompts, work, __file__)
    # Both sides run the same weights: their logits of one token sequence before training.
    import numpy as np

    gap = float(np.max(np.abs(np.asarray(results["ours"][0].pop("probe_logits"))
                              - np.asarray(results["tunix"][0].pop("probe_logits")))))
    for runs in results.values():
        for r in runs:
            r.pop("probe_logits", None)
    print(f"same weights on both sides: max |logit difference| = {gap:.2e} over {len(PROBE_IDS)} tokens", flush=True)
    if gap > 1e-3:
        sys.exit(f"error: Tunix and our model disagree on the same weights (max logit difference {gap:.3g})")
    summary = summarise(results, args, "tunix")
    summary["max_logit_difference"] = gap
    summary["tunix"]["version"] = TUNIX_VERSION
    summary["settings"]["jax"] = {"ours": __import__("jax").__version__, "tunix": results["tunix"][0]["jax"]}
    warn_regressions("grpo_vs_tunix", summary)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
