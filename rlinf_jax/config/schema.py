"""The typed config schema: one dataclass per section.

Every recipe in ``configs/`` is validated against these classes; a key that is not here
is a typo, and a value of the wrong type is rejected before anything runs. The ``data``
and ``reward`` sections are the data and reward layers' own config classes. Which keys
each ``runner.task`` reads is declared by the task (``rlinf_jax.tasks``); a key a run would
ignore is refused there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlinf_jax.agents.config import AgentConfig
from rlinf_jax.data.config import DataConfig
from rlinf_jax.rewards.config import RewardConfig


@dataclass
class RunnerConfig:
    # Which flow runs: "embodied" (PPO on a batched env), "offpolicy" (SAC, CrossQ, RLPD,
    # IQL on a batched env, with a replay buffer), "sft" (supervised fine-tuning of a
    # language model) or "reasoning" (RL of a language model on verifiable rewards).
    task: str = "embodied"
    output_dir: str = "runs"
    experiment_name: str = "ppo_brax_inverted_pendulum"
    seed: int = 0
    # Seeds side by side (embodied and off-policy fused runs): this many independent runs
    # of the recipe in one program, seeded runner.seed, runner.seed + 1, ...; or the seeds
    # listed in runner.seeds. Metrics are logged per seed and as a mean with its 95%
    # interval (docs/seeds.md).
    num_seeds: int = 1
    seeds: list[int] = field(default_factory=list)
    # Training iterations (one iteration = one rollout of the env batch + its PPO update).
    max_steps: int = 100
    # Iterations between checkpoints / evaluations; 0 disables (a final one still happens).
    save_interval: int = 50
    eval_interval: int = 25
    # Which episodes each evaluation of an env run plays: "fresh" draws other episodes at
    # every evaluation (its key folds in the step); "fixed" plays the same ones every time
    # (the step-0 evaluation's), so the change between two points of the curve is the
    # policy's alone, not the episodes'. Language-model runs always score the same prompts.
    eval_episodes: str = "fresh"
    log_interval: int = 5
    # "none", "auto" (latest checkpoint of this run directory) or a checkpoint path.
    resume: str = "none"
    # Let a resume delete what it would rewrite in the run folder: checkpoints (and logged
    # steps) after a resume point named in this run, or another run's checkpoints; without
    # it such a resume is refused.
    resume_overwrite: bool = False
    keep_checkpoints: int = 3
    # Stop with an error after this many iterations in a row with a skipped (non-finite) update.
    max_nonfinite_updates: int = 10
    progress_bar: bool = True
    tensorboard: bool = True
    # JAX's persistent compilation cache: a rerun or a resume loads its compiled programs
    # instead of compiling them again. "" turns it off.
    compilation_cache: str = "~/.cache/rlinf_jax/jax"
    # XLA flags for JAX's CPU backend, added to XLA_FLAGS before JAX starts when the run is
    # on the CPU (a flag XLA_FLAGS already sets is left as the user set it). "default": the
    # project's defaults for CPUs (rlinf_jax.runtime.xla_flags.CPU_DEFAULT_FLAGS); "" none;
    # any other value: those flags.
    xla_cpu_flags: str = "default"


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
    # tabletop (VLA): control sub-steps per action chunk, camera image size in px, and envs
    # per group sharing one episode (GRPO's groups; 1 = every env its own episode).
    chunk_length: int = 1
    image_size: int = 32
    group_size: int = 1
    # tabletop: "random" draws the object's and pads' cells per episode, "task" fixes them
    # per task (LIBERO-like, the easier benchmark); terminate_on_success ends an episode at
    # its first success instead of at episode_length.
    layout: str = "random"
    terminate_on_success: bool = False
    # Host simulators (suite "gym": a Gymnasium env id as env.name, "module:id" imports the
    # module that registers it), stepped by worker processes: how many (at most the envs of
    # a micro-batch), the interpreter they run under (another virtual environment when the
    # simulator's pins conflict with ours) and how long one step may take before a worker
    # is replaced.
    num_workers: int = 1
    # "" = this interpreter; a path to another one; or the name of a worker environment
    # built by `python -m rlinf_jax.envs.install NAME` (e.g. metaworld).
    worker_python: str = ""
    # The CPU cores the env workers run on (every core they may use, [] = no pinning): the
    # host's analogue of placing the env component on devices of its own, e.g. [1] with the
    # trainer started under `taskset -c 0`, so policy and simulator never share a core.
    worker_cpus: list[int] = field(default_factory=list)
    step_timeout_s: float = 60.0
    # How long a worker may take to start (import the simulator, build and reset its envs)
    # before the run stops with an error saying so.
    worker_start_timeout_s: float = 120.0
    # A simulator that keeps failing stops the run: more than this many worker replacements
    # within 100 steps of a pool is one error line naming the env, the last worker's exit
    # code and its last output (0 = the first failure stops the run).
    max_worker_restarts: int = 10
    # Keyword arguments of gymnasium.make (e.g. {env_name: reach-v3} for Meta-World/MT1).
    gym_kwargs: dict[str, Any] = field(default_factory=dict)
    # A camera whose image the policy sees beside the state (robosuite's "agentview", ...;
    # "" = state only), env.image_size px square: observations {image, tokens, proprio} as
    # the tabletop's, for actor.model.kind=vla.
    camera: str = ""
    # A simulator's assets that its package does not ship, supplied by the user: LIBERO's
    # scene assets (the folder holding scenes/, articulated_objects/, ...) for
    # env.name=libero:<suite>/<task>.
    assets_dir: str = ""


@dataclass
class LMSection:
    """``actor.model.lm``: the sizes of a fresh language model (runner.task sft | reasoning
    with actor.model.path=""), of a VLA's Llama backbone (kind=vla) and of pi0's Gemma prefix
    (kind=pi0)."""

    model_type: str = "qwen2"  # llama | qwen2 | qwen3 | gemma
    vocab_size: int = 100  # the character tokenizer's 100 ids
    hidden_size: int = 256
    intermediate_size: int = 688
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = True


@dataclass
class VLASection:
    """``actor.model.vla`` (kind=vla; pi0 reads the tower's sizes): the tiny OpenVLA-shaped
    policy's SigLIP-style tower, and its action chunks decoded in parallel over ``n_bins``
    bins per dimension."""

    patch_size: int = 8
    vision_hidden_size: int = 64
    vision_layers: int = 2
    vision_heads: int = 2
    n_bins: int = 256
    temperature: float = 1.0
    # The unit PPO's ratio is taken over (RLinf's logprob_type): "chunk" (the log-probs of
    # all chunk x 7 action tokens summed: one ratio per chunk), "action" (one per step of
    # the chunk, its 7 dimensions summed) or "token" (one per action token); the advantage
    # of the chunk applies to each, and the loss averages over them.
    logprob_level: str = "chunk"


@dataclass
class Pi0Section:
    """``actor.model.pi0`` (kind=pi0, pi05 or gr00t): a tiny pi0 is the ``vla`` tower, the ``lm`` sizes as
    its Gemma prefix, and a Gemma action expert of these sizes sharing the prefix's layers,
    KV heads and head_dim, denoising each action chunk in ``num_steps`` flow-matching steps
    (a tiny GR00T: the same tower, a Qwen3 of the ``lm`` sizes, and a DiT ``expert_hidden_size``
    wide whose outputs are ``expert_intermediate_size`` wide).
    RL log-probs come from flow_sde (one random SDE step of noise level ``noise_level``) or
    flow_noise (a learned std at every step). ``temperature`` scales the Gaussian each
    rollout chain starts from (1: the model's own action distribution; 0: the greedy
    action's start, exploring by the chain's stochastic steps alone); the log-probs never
    count the start, so every temperature re-scores exactly."""

    expert_hidden_size: int = 32
    expert_intermediate_size: int = 64
    num_steps: int = 4
    method: str = "flow_sde"  # flow_sde | flow_noise
    noise_level: float = 0.5
    temperature: float = 1.0
    # kind=pi05: bins of each proprio dimension in the prompt. openpi's 256 is what published
    # weights read; a tiny model cloned from a few hundred demonstrations sees most of 256
    # bins rarely and generalises better from fewer (docs/vla.md).
    state_bins: int = 256


@dataclass
class PolicyConfig:
    # Embodied runs: "mlp" (tanh-Gaussian actor + value MLP on flat observations), "vla"
    # (a vision-language-action model on image + instruction + proprioception), "pi0" (a
    # flow-matching VLA on the same observations), "pi05" (pi0.5: the state in the prompt,
    # the flow time in the action expert's norms; sized by the same sections as pi0) or "gr00t"
    # (GR00T-N1.5: an Eagle backbone of Qwen3 and a DiT action head; sized by the same sections).
    kind: str = "mlp"
    policy_hidden_sizes: list[int] = field(default_factory=lambda: [32, 32, 32, 32])
    value_hidden_sizes: list[int] = field(default_factory=lambda: [256, 256, 256, 256, 256])
    activation: str = "swish"
    # Initial std of the Gaussian policy is softplus(param) + min_std, as in Brax.
    min_std: float = 0.001
    init_log_std: float = 0.0
    # The control MLP's (kind=mlp: PPO's actor-critic, the off-policy actor and critics)
    # mixed precision: the dtype its matrix products run in (float32 | bfloat16).
    # Parameters, optimiser state and the loss's distribution maths stay float32. bfloat16
    # halves activation traffic where the hardware has fast bfloat16 dots (GPUs, TPUs);
    # XLA's CPU backend runs them slower than float32 (MKL's, matmul=mkl, faster on CPUs
    # with AMX), so the default is float32.
    compute_dtype: str = "float32"
    # Language models (runner.task sft | reasoning). ``path``: "" builds a fresh model of the
    # actor.model.lm sizes (the offline tiny character-level model); otherwise a run folder or
    # checkpoint of an sft/reasoning run, a Hugging Face directory (config.json + safetensors)
    # or a converted directory (config.json + params/).
    path: str = ""
    # Language models: compute and storage dtype (float32 | bfloat16 | float16); a VLA:
    # the backbone's compute dtype (float32 | bfloat16), its parameters stay float32.
    dtype: str = "float32"
    # Language models: the dtype parameters and optimiser state are stored in, when it differs
    # from dtype; "" = dtype. Mixed precision is dtype=bfloat16 param_dtype=float32 (torch's
    # autocast): products in bfloat16, updates accumulated in float32.
    param_dtype: str = ""
    # Language models and the off-policy family's actor and critics: the backend of every
    # matrix product. "xla" (XLA's own, any platform) or "mkl": Intel MKL through a CPU
    # custom call (pip install -e ".[mkl]" and a C++
    # compiler; one device; dtype float32 or bfloat16). On CPUs with AMX tiles MKL's bfloat16
    # products run several times faster than XLA's, which run slower than its float32 ones.
    matmul: str = "xla"
    # Language models: the decoder blocks stacked on a leading layer axis and run under one
    # lax.scan, so XLA compiles one block whatever the depth (minutes instead of tens for a
    # 28-layer model); the same numbers as the unrolled blocks up to float rounding. A run's
    # checkpoints keep the layout it trained with (resume with the same setting); any
    # checkpoint, converted or Hugging Face directory loads as actor.model.path into either.
    scan_layers: bool = False
    # Language models: what each decoder block keeps for the backward pass. "none" keeps every
    # activation autodiff wants; "full" only the block's input, recomputing the block in the
    # backward pass (about a third more compute, activations of one block at a time); "dots"
    # the outputs of the projections (q/k/v/o and the MLP's), recomputing norms, RoPE,
    # attention scores and softmax, and the MLP's activation.
    remat: str = "none"
    # LoRA adapters on the attention and MLP projections; 0 = full fine-tuning.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    # The frozen base of a LoRA run as stored: "none" (its dtype) or "nf4" (QLoRA: the
    # adapted kernels in 4-bit NormalFloat, blocks of 64 with absmax scales, about 1/7 of
    # their float32 bytes, dequantised inside each step; the qlora extra). Needs lora_rank > 0.
    base_qtype: str = "none"
    # Language models: the output head's vocabulary columns per chunk when training and
    # scoring log-probs (matmul=xla): an online softmax over chunks, recomputed in the
    # backward pass, so the [batch, tokens, vocab] float32 logits never exist whole (10 GiB
    # at 16 x 1024 tokens of a 152k vocabulary). 0 = the whole vocabulary at once.
    logits_chunk: int = 0
    # The model's sections by kind: a language model's sizes (the LM tasks' fresh model, a
    # VLA's backbone, pi0's Gemma prefix), a VLA's vision tower and action decoding, pi0's
    # action expert and denoising chain.
    lm: LMSection = field(default_factory=LMSection)
    vla: VLASection = field(default_factory=VLASection)
    pi0: Pi0Section = field(default_factory=Pi0Section)
    # kind=vla, pi0, pi05 or gr00t: a published architecture by name ("openvla-7b", "pi0", "pi05",
    # "gr00t-n1.5") instead of the
    # vla / lm / pi0 sizes, its action and state projections sized for the env
    # (which must render the model's image size). Fresh weights: plan such a run before
    # launching it (`python -m rlinf_jax.plan`); "" = the sizes above.
    architecture: str = ""


@dataclass
class OptimConfig:
    lr: float = 3e-4
    max_grad_norm: float = 1.0
    # "constant" or "linear" (decays to 0 at runner.max_steps).
    lr_schedule: str = "constant"
    # Language models: linear warm-up over this many optimiser steps, AdamW weight decay, and
    # the learning rate of PPO's value model (algorithm.adv_type=gae).
    warmup_steps: int = 0
    weight_decay: float = 0.0
    critic_lr: float = 1.0e-4
    # Adam's first-moment decay (the off-policy family; CrossQ uses 0.5).
    b1: float = 0.9


@dataclass
class ActorConfig:
    model: PolicyConfig = field(default_factory=PolicyConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # Language models: sequences per optimiser step (reasoning: a mini-batch of the rollout
    # batch; sft: examples per step) and per forward/backward pass (gradient accumulation).
    global_batch_size: int = 64
    micro_batch_size: int = 64


@dataclass
class LMAlgorithmSection:
    """``algorithm.lm``: language-model RL (runner.task=reasoning) beyond what it shares
    with the control PPO above it (update_epochs, gamma, gae_lambda, entropy_coef,
    value_coef; normalize_advantages for adv_type=gae, veRL's choice: the group and
    REINFORCE++ estimators normalise by their own definition)."""

    group_size: int = 8  # responses sampled per prompt
    clip_low: float = 0.2  # PPO ratio clip range [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.2  # DAPO's clip-higher raises this one, e.g. 0.28
    dual_clip: float = 0.0  # dual-clip constant c > 1; 0 = off
    # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    loss_agg: str = "token-mean"
    kl_coef: float = 0.0  # KL to the reference (initial) model; 0 = no reference model
    kl_type: str = "low_var_kl"  # k1 | abs | k2 | k3 (= low_var_kl)
    kl_in_reward: bool = False  # false: a loss term; true: subtracted from the rewards
    # DAPO dynamic sampling: resample up to max_resample times to fill the batch with prompt
    # groups whose rewards differ.
    dynamic_sampling: bool = False
    max_resample: int = 3
    value_clip: float = 0.2  # PPO value-model clip range; 0 = off


@dataclass
class OffPolicySection:
    """``algorithm.offpolicy``: the off-policy family (runner.task=offpolicy; algorithm.name
    = sac | crossq | rlpd | iql). An iteration is algorithm.rollout_length batched env
    steps, each followed by utd_ratio gradient steps on batch_size transitions sampled from
    the replay buffer."""

    utd_ratio: int = 1
    batch_size: int = 256
    replay_size: int = 1_000_000  # transitions the buffer holds (oldest overwritten)
    # Transitions collected with uniformly random actions before the first gradient step.
    learning_starts: int = 5000
    tau: float = 0.005  # Polyak rate of the target critics (crossq has none)
    num_q: int = 2  # critics in the ensemble
    num_min_q: int = 2  # the target's minimum over a random subset of this many (REDQ); = num_q: all
    actor_q_reduce: str = "min"  # min | mean: the ensemble's value in the actor loss
    init_alpha: float = 1.0  # initial entropy temperature
    learn_alpha: bool = True  # tune the temperature towards the target entropy
    target_entropy_per_dim: float = -1.0  # target entropy = this x the action size
    policy_delay: int = 1  # the actor and the temperature step once every policy_delay critic steps
    critic_norm: str = "none"  # none | layer (RLPD) | batch_renorm (CrossQ)
    renorm_momentum: float = 0.99  # batch_renorm: running-statistics momentum
    renorm_warmup: int = 100_000  # batch_renorm: updates of plain batch normalisation first
    # rlpd, iql: a transitions file (python -m rlinf_jax.collect; docs/offpolicy.md).
    demo_path: str = ""
    demo_ratio: float = 0.5  # rlpd: share of each batch drawn from the demonstrations
    expectile: float = 0.7  # iql: the value's expectile
    awr_temperature: float = 3.0  # iql: beta of the advantage weights exp(beta (Q - V))
    # Iterations of gradient steps on the dataset alone before the env is stepped (iql offline).
    offline_iterations: int = 0
    # Save the replay buffer with each checkpoint (exact resume); false: a resume starts
    # with an empty buffer and refills it (learning_starts random steps again).
    replay_in_checkpoint: bool = True


@dataclass
class AlgorithmConfig:
    """What every RL task reads at this level (its policy-gradient core: the control PPO's
    keys, most of which language-model RL shares), and a section per algorithm family for
    the keys only that family reads: ``lm`` and ``offpolicy``."""

    name: str = "ppo"  # a label for people (run listings); adv_type and loss_type choose the maths
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
    lm: LMAlgorithmSection = field(default_factory=LMAlgorithmSection)
    offpolicy: OffPolicySection = field(default_factory=OffPolicySection)


@dataclass
class ClusterConfig:
    # Devices the run may use ("all" or a count), counted over all devices of all hosts.
    num_devices: str = "all"
    # Which devices each component runs on: a preset (collocated | disaggregated |
    # hybrid | auto) or RLinf's mapping, e.g. {env: 0-3, rollout: 4-7, actor: all}.
    component_placement: Any = "collocated"
    # Per-component mesh shape over its devices, e.g. {actor: {data: 2, fsdp: 2}}; one axis
    # may be "all" (what the others leave: {actor: {fsdp: all}} on any slice); a component
    # not named gets {data: <its device count>}.
    mesh: dict[str, Any] = field(default_factory=dict)
    # static: each component keeps its devices; dynamic: once the iteration's data is
    # produced, the update runs on the actor's devices plus those of the components idle
    # meanwhile (the rollout's; a reasoning run's reference too; an env keeps its own), the
    # actor's state moving there and back (time/switch_s), then each gets its devices back.
    # For disaggregated and hybrid placements of on-policy runs (docs/placement.md).
    scaling: str = "static"
    # Logical parameter axis -> mesh axis overrides, e.g. {mlp: fsdp}.
    partition_rules: dict[str, Any] = field(default_factory=dict)
    # Multi-host runs (python -m rlinf_jax.launch): how often a job whose process died is
    # restarted from its latest checkpoint before the launcher gives up.
    max_restarts: int = 2
    # ... and how long a process may make no progress (no output line, no finished chunk of
    # iterations) before it counts as hung and the job restarts; 0 = never.
    hang_timeout_s: float = 1800.0
    # Before the first step, on a backend that reports each device's memory (GPUs, TPUs):
    # compile the iteration's programs for the run's devices and refuse, in one line, a
    # layout whose peak exceeds it (instead of failing out of memory minutes in). Every
    # layout the planner knows; it costs one more compile of each program at start-up.
    memory_check: bool = True


@dataclass
class FlowConfig:
    # fused: the whole iteration is one jit per chunk (collocated, on-policy, one
    # micro-batch); staged: jitted stages on their components' meshes (flow.staged);
    # auto: fused where it applies, else staged.
    runner: str = "auto"
    # The env batch is cut into this many micro-batches that stream through env and
    # rollout, so that on disjoint devices one steps while the other infers.
    num_micro_batches: int = 1
    # How many policy versions the experience the learner trains on lags behind it: 0 =
    # on-policy (every layout the fused runner's numbers); 1 = the rollout of iteration i
    # acts with the parameters of the start of iteration i-1, so it overlaps the update.
    max_staleness: int = 0
    # Park the actor's optimiser state in host memory (JAX memory kinds) while the
    # rollout runs; worth it when actor and rollout share devices and memory is tight.
    offload_optimizer: bool = False


@dataclass
class RolloutConfig:
    """Sampling of responses (training) and of evaluation answers."""

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    # Evaluation: greedy (0) by default; prompts per generate call.
    eval_temperature: float = 0.0
    eval_batch_size: int = 256


@dataclass
class SFTConfig:
    """A supervised warm start run before RL (runner.task=reasoning, actor.model.path="").

    It trains on the train split's prompts with ``\boxed{answer}`` targets; ``train_levels``
    (empty: data.train_levels) picks its procedural levels, so the RL data can be harder.
    """

    warm_start_steps: int = 0  # 0 = no warm start
    lr: float = 1.0e-3
    batch_size: int = 64
    train_levels: list[int] = field(default_factory=list)
    # actor.model.kind=vla: scripted-expert episodes behaviour-cloned before RL.
    num_demos: int = 64
    # kind=vla, DAgger after the warm_start_steps: each round rolls the policy out on
    # dagger_episodes training episodes, labels the visited states with the expert's chunks,
    # adds them to the data and clones dagger_steps more steps. 0 rounds = plain cloning.
    dagger_rounds: int = 0
    dagger_episodes: int = 128
    dagger_steps: int = 500
    # kind=vla and the flow kinds (pi0, pi05, gr00t), after the cloning: fit the value head
    # alone (sft.lr) for critic_warmup_steps on the discounted returns (algorithm.gamma,
    # reward_scale) of critic_warmup_episodes sampled episodes of the cloned policy, so GAE
    # does not start from a zero critic.
    critic_warmup_steps: int = 0
    critic_warmup_episodes: int = 128


@dataclass
class Config:
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
