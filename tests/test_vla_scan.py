"""The VLA families' scanned layer stacks (`actor.model.scan_layers` for kind=vla and pi0: the
vision towers' and the language models' blocks under lax.scan, as `CausalLM`'s): the same
seed gives the same policy as the unrolled blocks, in every call PPO makes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rlinf_jax as rj
from rlinf_jax.tasks.embodied.setup import make_setup


def _calls(recipe: str, scan: bool):
    cfg = rj.load_config(recipe, [f"actor.model.scan_layers={str(scan).lower()}", "env.num_envs=4"])
    setup = make_setup(cfg)
    obs = jax.jit(setup.env.reset)(jax.random.PRNGKey(0)).obs
    model = nnx.merge(setup.graphdef, setup.params)
    policy = setup.policy
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    action, stored, logprob = policy.act(model, obs, keys)
    evaluated = policy.evaluate_actions(model, obs, stored, jax.random.PRNGKey(2))
    return {
        "action": action, "stored": stored, "logprob": logprob, "evaluated": evaluated,
        "deterministic": policy.act_deterministic(model, obs), "value": policy.critic(model, obs),
        "params": sum(x.size for x in jax.tree.leaves(setup.params)),
    }


@pytest.mark.parametrize("recipe", ["ppo_vla_tabletop", "ppo_pi0_tabletop"])
def test_a_scanned_vla_is_the_unrolled_one(recipe):
    unrolled, scanned = _calls(recipe, False), _calls(recipe, True)
    assert scanned["params"] == unrolled["params"]
    for name in ("action", "stored", "logprob", "evaluated", "deterministic", "value"):
        for a, b in zip(jax.tree.leaves(unrolled[name]), jax.tree.leaves(scanned[name]), strict=True):
            np.testing.assert_allclose(np.asarray(b, np.float64), np.asarray(a, np.float64), rtol=1e-5, atol=1e-4,
                                       err_msg=f"{recipe}: {name}")


@pytest.mark.parametrize("recipe", ["ppo_vla_tabletop", "ppo_pi0_tabletop"])
def test_rematerialised_blocks_give_the_same_gradients(recipe):
    """`actor.model.remat=full` recomputes each block in the backward pass: the PPO loss's
    gradients are those of the blocks that kept their activations."""
    grads, temps = [], []
    for remat in ("none", "full"):
        cfg = rj.load_config(recipe, ["actor.model.scan_layers=true", f"actor.model.remat={remat}", "env.num_envs=4"])
        setup = make_setup(cfg)
        obs = jax.jit(setup.env.reset)(jax.random.PRNGKey(0)).obs
        policy = setup.policy
        stored = policy.act(nnx.merge(setup.graphdef, setup.params), obs, jax.random.split(jax.random.PRNGKey(1), 4))[1]

        def loss(params):
            logprob, _, value = policy.evaluate_actions(nnx.merge(setup.graphdef, params), obs, stored,
                                                        jax.random.PRNGKey(2))
            return jnp.sum(logprob) + jnp.sum(value)

        grad = jax.jit(jax.grad(loss))
        temps.append(grad.lower(setup.params).compile().memory_analysis().temp_size_in_bytes)
        grads.append(grad(setup.params))
    # ... and keep less for it: the compiler's own count of the backward pass's buffers.
    assert temps[1] < temps[0], temps
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1]), strict=True):
        # Float reassociation of the recomputed blocks: off by a millionth of the leaf's scale.
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6 * float(np.max(np.abs(a))) + 1e-6)
