"""pi0, pi0.5 and GR00T-N1.5 as embodied policies (actor.model.kind=pi0 / pi05 / gr00t): the
rollout's chunk log-prob, the trainer's re-scored one and a numpy Gaussian density of the
stored chain agree; each env's sample depends on its own key alone; the stored chain
survives the trainer's reshapes; pi0.5 reads the proprioception from its prompt's state
tokens, and one PPO iteration of pi0.5 and of GR00T is the same in every layout.

The hand references take only the network's velocity (and flow-noise's std head) from the
model, at the chain's stored states, and rebuild every denoising step's mean, std,
log-density and entropy in float64 numpy from the piRL formulas."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlinf_jax.config import load_config
from rlinf_jax.envs import make_env
from rlinf_jax.errors import BadInput
from tests.test_vla_flow import TINY_VLA, changed_leaves
from tests.test_vla_flow import _obs as vla_obs

# The tiny VLA's sizes (less the keys only a VLA reads) plus a one-layer expert and 3
# denoising steps.
VLA_ONLY = ("actor.model.vla.n_bins", "sft.dagger_rounds")
TINY_PI0 = [
    *(o for o in TINY_VLA if not o.startswith(VLA_ONLY)),
    "actor.model.pi0.expert_hidden_size=16",
    "actor.model.pi0.expert_intermediate_size=32",
    "actor.model.pi0.num_steps=3",
]
N, H, A = 3, 2, 7


def kind_overrides(kind: str) -> list[str]:
    """The model kind, on the backbone it is built on (GR00T's is a Qwen3)."""
    return [f"actor.model.kind={kind}", f"actor.model.lm.model_type={'qwen3' if kind == 'gr00t' else 'gemma'}"]


def _obs(batch=4, seed=0):
    return vla_obs(batch, seed)


class Jitted:
    """The policy's functions jitted over the model's parameters, plus the raw network
    outputs (velocity, flow-noise std) the hand references start from."""

    def __init__(self, method: str, kind: str = "pi0", *extra: str):
        from rlinf_jax.policies.embodied import embodied_policy

        cfg = load_config("ppo_pi0_tabletop", [*TINY_PI0, f"actor.model.pi0.method={method}", *kind_overrides(kind), *extra])
        self.policy = policy = embodied_policy(cfg, make_env(cfg.env))
        self.noise_level = cfg.actor.model.pi0.noise_level
        graphdef, self.params = nnx.split(policy.build(nnx.Rngs(0)))
        merge = lambda p: nnx.merge(graphdef, p)  # noqa: E731
        self.act = jax.jit(lambda p, obs, keys: policy.act(merge(p), obs, keys))
        self.evaluate = jax.jit(lambda p, obs, stored: policy.evaluate_actions(merge(p), obs, stored, None))
        self.critic = jax.jit(lambda p, obs: policy.critic(merge(p), obs))
        self.greedy = jax.jit(lambda p, obs: policy.act_deterministic(merge(p), obs))

        def heads(p, obs, x, t):
            model = merge(p)
            prefix, state = policy.encode(model, obs)
            v, std, _ = model.outputs(prefix, state, x, jnp.full((x.shape[0],), t))
            return v, (jnp.zeros_like(v) if std is None else std)

        self._heads = jax.jit(heads)

    def heads(self, obs, x, t):
        v, std = self._heads(self.params, obs, jnp.asarray(x, jnp.float32), jnp.float32(t))
        return np.asarray(v, np.float64), np.asarray(std, np.float64)


@pytest.fixture(scope="module", params=["pi0", "pi05", "gr00t"])
def sde(request):
    return Jitted("flow_sde", request.param)


def _gauss(x, mean, std):
    return -0.5 * ((x - mean) / std) ** 2 - np.log(std) - 0.5 * math.log(2 * math.pi)


def test_flow_sde_logprob_is_the_hand_density_of_the_stochastic_step(sde):
    obs = _obs()
    keys = jax.random.split(jax.random.PRNGKey(7), 4)
    action, stored, logprob = sde.act(sde.params, obs, keys)
    chain, step = np.asarray(stored["chain"], np.float64), np.asarray(stored["step"])
    assert chain.shape == (4, N + 1, H, A) and step.dtype == np.int32 and ((0 <= step) & (step < N)).all()
    np.testing.assert_allclose(np.asarray(action), np.clip(chain[:, -1], -1, 1), atol=1e-6)

    a = sde.noise_level
    ref_logprob, ref_entropy = np.zeros(4), np.zeros(4)
    for j in range(N):
        t = 1.0 - j / N
        v, _ = sde.heads(obs, chain[:, j], t)
        x, x_next = chain[:, j], chain[:, j + 1]
        for b in range(4):
            if step[b] != j:  # a plain Euler step
                np.testing.assert_allclose(x_next[b], x[b] - v[b] / N, atol=2e-5)
                continue
            sigma = a * math.sqrt(t / (1.0 - (1.0 - 1.0 / N if t == 1.0 else t)))
            mean = x[b] - v[b] / N - sigma**2 / (2 * t * N) * (x[b] + (1 - t) * v[b])
            std = sigma / math.sqrt(N)
            ref_logprob[b] = _gauss(x_next[b], mean, std).sum()
            ref_entropy[b] = H * A * (0.5 * math.log(2 * math.pi * math.e) + math.log(std))
    np.testing.assert_allclose(np.asarray(logprob), ref_logprob, rtol=1e-4, atol=1e-3)

    again, entropy, value = sde.evaluate(sde.params, obs, stored)
    np.testing.assert_allclose(np.asarray(again), np.asarray(logprob), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(entropy), ref_entropy, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(value), np.asarray(sde.critic(sde.params, obs)), rtol=1e-5, atol=1e-6)


def test_greedy_action_is_the_euler_ode_from_zero_noise(sde):
    obs = _obs()
    x = np.zeros((4, H, A))
    for j in range(N):
        v, _ = sde.heads(obs, x, 1.0 - j / N)
        x = x - v / N
    np.testing.assert_allclose(np.asarray(sde.greedy(sde.params, obs)), np.clip(x, -1, 1), atol=1e-5)


def test_each_env_sample_depends_only_on_its_own_key(sde):
    obs = _obs()
    keys = jax.random.split(jax.random.PRNGKey(3), 4)
    _, batch, logprob = sde.act(sde.params, obs, keys)
    one = jax.tree.map(lambda x: x[2:3], obs)
    _, alone, alone_logprob = sde.act(sde.params, one, keys[2:3])
    np.testing.assert_allclose(np.asarray(alone["chain"][0]), np.asarray(batch["chain"][2]), atol=1e-5)
    assert int(alone["step"][0]) == int(batch["step"][2])
    np.testing.assert_allclose(float(alone_logprob[0]), float(logprob[2]), rtol=1e-5, atol=1e-4)
    # ... and other keys give other chains.
    assert float(jnp.abs(batch["chain"][0, 0] - batch["chain"][1, 0]).max()) > 0.1


def test_temperature_scales_only_the_chains_start_and_rescoring_stays_exact():
    """``pi0.temperature`` scales the Gaussian a rollout chain starts from (the same draw):
    0 starts where the greedy action does. The log-prob never counts the start, so the
    trainer re-scores the stored chain to the rollout's log-prob at any temperature."""
    obs = _obs()
    keys = jax.random.split(jax.random.PRNGKey(11), 4)
    starts = {}
    for temperature in (1.0, 0.5, 0.0):
        sde = Jitted("flow_sde", "pi0", f"actor.model.pi0.temperature={temperature}")
        _, stored, logprob = sde.act(sde.params, obs, keys)
        starts[temperature] = np.asarray(stored["chain"][:, 0])
        again, _, _ = sde.evaluate(sde.params, obs, stored)
        np.testing.assert_allclose(np.asarray(again), np.asarray(logprob), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(starts[0.5], 0.5 * starts[1.0], atol=1e-6)
    assert np.abs(starts[1.0]).max() > 1.0 and not starts[0.0].any()


def test_flow_noise_logprob_sums_hand_densities_over_every_step():
    # pi0's; pi0.5's flow-noise chains are the same FlowModel code (tests/test_pi05.py
    # re-scores them), and its flow-SDE path is checked here against the densities.
    noise = Jitted("flow_noise")
    obs = _obs(batch=3, seed=1)
    keys = jax.random.split(jax.random.PRNGKey(11), 3)
    _, stored, logprob = noise.act(noise.params, obs, keys)
    chain = np.asarray(stored["chain"], np.float64)
    assert (np.asarray(stored["step"]) == -1).all()
    ref_logprob, ref_entropy = np.zeros(3), np.zeros(3)
    for j in range(N):
        v, std = noise.heads(obs, chain[:, j], 1.0 - j / N)
        assert (std >= 0.08 - 1e-6).all() and (std <= 0.16 + 1e-6).all()  # the head's range
        mean = chain[:, j] - v / N
        ref_logprob += _gauss(chain[:, j + 1], mean, std).sum(axis=(1, 2))
        ref_entropy += (0.5 * np.log(2 * math.pi * math.e * std**2)).sum(axis=(1, 2))
    np.testing.assert_allclose(np.asarray(logprob), ref_logprob, rtol=1e-4, atol=1e-2)
    again, entropy, value = noise.evaluate(noise.params, obs, stored)
    np.testing.assert_allclose(np.asarray(again), np.asarray(logprob), rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(np.asarray(entropy), ref_entropy, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(np.asarray(value), np.asarray(noise.critic(noise.params, obs)), rtol=1e-5, atol=1e-6)


def test_flow_matching_warm_start_beats_the_mean_action():
    """The warm start's flow-matching loss falls, and the greedy ODE chunk it leads to is
    closer to an "expert" (a fixed function of the proprioception) than the dataset's mean
    chunk, the best observation-blind answer, and than the untrained sampler."""
    from rlinf_jax.tasks.embodied.cloning import flow_matching_clone
    from rlinf_jax.policies.embodied import embodied_policy

    cfg = load_config("ppo_pi0_tabletop", TINY_PI0)
    policy = embodied_policy(cfg, make_env(cfg.env))
    graphdef, params = nnx.split(policy.build(nnx.Rngs(0)))
    obs = _obs(batch=24, seed=5)
    p = np.asarray(obs["proprio"])
    actions = np.tanh(np.stack([p[:, [0, 1, 2, 3, 0, 1, 2]], -p[:, [3, 2, 1, 0, 3, 2, 1]]], axis=1))
    data = {**{k: np.asarray(v) for k, v in obs.items()}, "action": actions.astype(np.float32)}
    greedy = jax.jit(lambda p: policy.act_deterministic(nnx.merge(graphdef, p), obs))
    untrained = np.abs(np.asarray(greedy(params)) - actions).mean()
    new, loss, error = flow_matching_clone(policy, graphdef, params, data, steps=150, lr=3e-3, batch_size=24, seed=0)
    assert loss[-10:].mean() < 0.6 * loss[:10].mean(), (loss[:10].mean(), loss[-10:].mean())
    # The reported error is the greedy policy's, recomputed here.
    np.testing.assert_allclose(np.abs(np.asarray(greedy(new)) - actions).mean(), error, rtol=1e-4)
    mean_chunk = np.abs(actions - actions.mean(0)).mean()
    assert error < 0.85 * mean_chunk and error < 0.85 * untrained, (error, mean_chunk, untrained)


@pytest.mark.slow
def test_critic_warmup_fits_only_a_flow_models_value_head():
    """The warm start's critic warm-up (``sft.critic_warmup_steps``) runs for a flow VLA: it
    moves the value head alone, and its error on the sampled returns falls."""
    from rlinf_jax.policies.embodied import embodied_policy
    from rlinf_jax.tasks.embodied.cloning import fit_value_head

    cfg = load_config("ppo_pi0_tabletop", [*TINY_PI0, *kind_overrides("gr00t"), "sft.critic_warmup_steps=60"])
    assert cfg.sft.critic_warmup_steps == 60  # read for a flow kind, not refused
    policy = embodied_policy(cfg, make_env(cfg.env))
    graphdef, params = nnx.split(policy.build(nnx.Rngs(0)))
    lines = []
    new, err = fit_value_head(policy, graphdef, params, make_env(cfg.env), episodes=8, steps=60, lr=1e-2,
                              batch_size=8, gamma=0.9, reward_scale=10.0, seed=0, log=lines.append)
    moved = changed_leaves(params, new)
    assert moved and all(k.startswith("['value_head']") for k in moved), moved
    first = float(lines[-1].split("value MSE ")[1].split(" ->")[0])
    assert np.isfinite(err) and err < first, lines[-1]


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("actor.model.pi0.method=ode", "pi0.method='ode' is unknown"),
        ("actor.model.pi0.num_steps=0", "pi0.num_steps=0 must be >= 1"),
        ("actor.model.pi0.expert_hidden_size=15", "must be even"),
        ("actor.model.pi0.noise_level=0", "pi0.noise_level=0.0 must be"),
        ("actor.model.pi0.temperature=-1", "pi0.temperature=-1.0 must be"),
        ("actor.model.pi0.state_bins=1", "pi0.state_bins=1 must be >= 2"),
    ],
)
def test_bad_pi0_settings_are_refused(override, fragment):
    with pytest.raises(BadInput, match=fragment):
        load_config("ppo_pi0_tabletop", [*TINY_PI0, override])


def test_pi05_reads_the_proprioception_from_its_prompt(sde):
    """pi0.5's prompt ends with one token per proprio dimension, its 256-bin index over the
    env's range; its actions and value follow the proprioception through them alone."""
    if sde.policy.config.__class__.__name__ != "Pi05Config":
        pytest.skip("pi0 has a state token, not state tokens")
    from rlinf_jax.envs.tabletop import scene

    policy, obs = sde.policy, _obs()
    ids, mask, _ = policy.prompt(obs)
    low, high = np.append(scene.EE_LOW, 0.0), np.append(scene.EE_HIGH, 1.0)
    scaled = 2 * (np.asarray(obs["proprio"], np.float64) - low) / (high - low) - 1
    bins = np.clip(np.digitize(scaled, np.linspace(-1, 1, 257)[:-1]) - 1, 0, 255)
    np.testing.assert_array_equal(np.asarray(ids[:, -4:]), policy.state_token_base + bins)
    assert bool(mask[:, -4:].all()) and policy.state_token_base == policy.config.paligemma.image_token_id + 1
    assert int(ids.max()) < policy.config.paligemma.text.vocab_size
    # A fresh expert's adaptive norms start closed (zero gates: it reads nothing of the
    # prefix yet), so the parameters are perturbed first, as training perturbs them.
    leaves, treedef = jax.tree.flatten(sde.params)
    keys = jax.random.split(jax.random.PRNGKey(0), len(leaves))
    params = jax.tree.unflatten(treedef, [p + 0.1 * jax.random.normal(k, p.shape, p.dtype)
                                          for p, k in zip(leaves, keys)])
    moved = {**obs, "proprio": obs["proprio"] + jnp.asarray([0.2, -0.15, 0.1, 0.5], jnp.float32)}
    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, H, A)), jnp.float32)
    v = [np.asarray(sde._heads(params, o, x, jnp.float32(0.5))[0]) for o in (obs, moved)]
    assert np.abs(v[0] - v[1]).max() > 1e-3
    assert float(jnp.abs(sde.critic(params, obs) - sde.critic(params, moved)).max()) > 0
    assert np.abs(np.asarray(sde._heads(sde.params, obs, x, jnp.float32(0.5))[0])).max() > 0


def test_pi05_state_tokens_are_the_vocabularys_last_ids_at_every_size():
    """The tiny model's vocabulary ends with the 256 bins; the published one (PaliGemma's
    257,152 ids, the image token past them) holds them at its end too. An env without a
    proprio range is refused."""
    from rlinf_jax.policies.embodied import embodied_policy
    from rlinf_jax.policies.vla.pi0_embodied import Pi05Policy

    cfg = load_config("ppo_pi05", ["env.num_envs=2", "env.num_eval_envs=2"])
    env = make_env(cfg.env)
    policy = embodied_policy(cfg, env)
    ids, _, _ = policy.prompt(_obs())
    vocab = policy.config.paligemma.text.vocab_size
    assert vocab == 257152 and policy.state_token_base == vocab - 256
    assert int(ids[:, -4:].min()) >= vocab - 256 and int(ids[:, -4:].max()) < vocab
    with pytest.raises(BadInput, match="proprio_range"):
        Pi05Policy(cfg.actor.model, 224, env.unwrapped.vocab_size, 8, 7, 4, None)


def test_pi05_state_bins_set_the_prompts_resolution_and_the_vocabulary():
    """``actor.model.pi0.state_bins`` cuts each proprio dimension into that many bins, at the
    vocabulary's last ids (numpy's digitize on the same edges); the published pi0.5 reads
    openpi's 256 and refuses another count in one line."""
    from rlinf_jax.envs.tabletop import scene
    from rlinf_jax.policies.embodied import embodied_policy

    cfg = load_config("ppo_pi0_tabletop", [*TINY_PI0, *kind_overrides("pi05"), "actor.model.pi0.state_bins=16"])
    env = make_env(cfg.env)
    policy = embodied_policy(cfg, env)
    obs = _obs()
    ids, _, _ = policy.prompt(obs)
    vocab = policy.config.paligemma.text.vocab_size
    assert vocab == env.unwrapped.vocab_size + 1 + 16 and policy.state_token_base == vocab - 16
    low, high = np.append(scene.EE_LOW, 0.0), np.append(scene.EE_HIGH, 1.0)
    scaled = 2 * (np.asarray(obs["proprio"], np.float64) - low) / (high - low) - 1
    bins = np.clip(np.digitize(scaled, np.linspace(-1, 1, 17)[:-1]) - 1, 0, 15)
    np.testing.assert_array_equal(np.asarray(ids[:, -4:]), vocab - 16 + bins)
    published = load_config("ppo_pi05", ["env.num_envs=2", "env.num_eval_envs=2", "actor.model.pi0.state_bins=32"])
    with pytest.raises(BadInput, match="state_bins=32: the published pi0.5 reads its state in openpi's 256 bins"):
        embodied_policy(published, make_env(published.env))


@pytest.mark.slow
@pytest.mark.devices(2)
@pytest.mark.parametrize("kind", ["pi05", "gr00t"])
def test_flow_vla_ppo_iteration_is_the_same_collocated_disaggregated_and_hybrid(kind):
    """One iteration, one minibatch of one epoch, in each layout: the update sees the
    parameters that sampled the chains, so after the trainer's flatten / shuffle /
    minibatch reshapes every re-scored log-prob must equal the rollout's (ratio 1: zero KL,
    no clipping), and the layouts must agree."""
    from tests.test_vla_flow import ppo_iteration_in_each_layout

    out = ppo_iteration_in_each_layout(
        "ppo_pi0_tabletop", [*TINY_PI0, *kind_overrides(kind), "algorithm.num_minibatches=1"])
    metrics, _ = out["fused"]
    assert abs(metrics["train/approx_kl"]) < 1e-5, metrics
    assert metrics["train/clip_frac"] == 0.0, metrics
    assert metrics["train/skipped_updates"] == 0 and np.isfinite(metrics["train/total_loss"])
