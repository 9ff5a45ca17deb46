"""The VLA families' scanned layer stacks (`actor.model.scan_layers` for kind=vla and pi0: the
vision towers' and the language models' blocks under lax.scan, as `CausalLM`'s): the same
seed gives the same policy as the unrolled blocks, in every call PPO makes."""

from __future__ import annotations

import jax
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
