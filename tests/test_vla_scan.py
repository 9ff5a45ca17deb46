"""The VLA families' scanned layer stacks and rematerialisation (`actor.model.scan_layers` and
`actor.model.remat` for kind=vla, pi0 and pi05: the vision towers' and the language models' blocks
under lax.scan and a checkpoint policy, as `CausalLM`'s): the same seed gives the same
policy as the unrolled blocks in every call PPO makes, and the same gradients with fewer
buffers kept for the backward pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rlinf_jax as rj
from rlinf_jax.tasks.embodied.setup import make_setup


def _run(recipe: str, scan: bool, remat: str = "none"):
    cfg = rj.load_config(recipe, [f"actor.model.scan_layers={str(scan).lower()}", f"actor.model.remat={remat}",
                                  "env.num_envs=4"])
    setup = make_setup(cfg)
    obs = jax.jit(setup.env.reset)(jax.random.PRNGKey(0)).obs
    model = nnx.merge(setup.graphdef, setup.params)
    policy = setup.policy
    action, stored, logprob = policy.act(model, obs, jax.random.split(jax.random.PRNGKey(1), 4))

    def loss(params):
        logp, _, value = policy.evaluate_actions(nnx.merge(setup.graphdef, params), obs, stored, jax.random.PRNGKey(2))
        return jnp.sum(logp) + jnp.sum(value)

    grad = jax.jit(jax.grad(loss))
    return {
        "calls": {
            "action": action, "stored": stored, "logprob": logprob,
            "evaluated": policy.evaluate_actions(model, obs, stored, jax.random.PRNGKey(2)),
            "deterministic": policy.act_deterministic(model, obs), "value": policy.critic(model, obs),
        },
        "params": sum(x.size for x in jax.tree.leaves(setup.params)),
        "grads": grad(setup.params),
        # The compiler's own count of the buffers the backward pass keeps.
        "temp_bytes": grad.lower(setup.params).compile().memory_analysis().temp_size_in_bytes,
    }


@pytest.mark.slow
# pi0.5 stands for both flow families: the towers, LMs and expert stacks are the same code,
# and pi0.5's expert also carries its norms' condition through the scan.
@pytest.mark.parametrize("recipe", ["ppo_vla_tabletop", "ppo_pi05_tabletop"])
def test_a_scanned_and_rematerialised_vla_is_the_unrolled_one(recipe):
    unrolled, scanned, remat = _run(recipe, False), _run(recipe, True), _run(recipe, True, "full")
    assert scanned["params"] == unrolled["params"]
    for name in unrolled["calls"]:
        for a, b in zip(jax.tree.leaves(unrolled["calls"][name]), jax.tree.leaves(scanned["calls"][name]), strict=True):
            np.testing.assert_allclose(np.asarray(b, np.float64), np.asarray(a, np.float64), rtol=1e-5, atol=1e-4,
                                       err_msg=f"{recipe}: {name}")
    # Rematerialised blocks recompute in the backward pass: the same gradients, fewer buffers.
    assert remat["temp_bytes"] < scanned["temp_bytes"], (remat["temp_bytes"], scanned["temp_bytes"])
    for a, b in zip(jax.tree.leaves(scanned["grads"]), jax.tree.leaves(remat["grads"]), strict=True):
        # Float reassociation of the recomputed blocks: off by a millionth of the leaf's scale.
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6 * float(np.max(np.abs(a))) + 1e-6)
