"""Behaviour cloning of a VLA policy from the tabletop's scripted expert: the warm start RL
fine-tuning needs (a random VLA never completes a pick-and-place, so PPO and GRPO would have
no success to reinforce).

Demonstrations come from the expert on training-split episodes (the same envs the RL run
then trains on, never the test splits). Each expert action chunk is digitised into the
policy's action bins, and the loss is the cross-entropy of the parallel-decoded chunk:
exactly the log-prob PPO later optimises, so the warm start and the RL objective agree.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rlinf_jax.errors import BadInput


def expert_demos(env, num_episodes: int, seed: int) -> dict[str, np.ndarray]:
    """Successful expert steps of ``num_episodes`` training episodes as numpy arrays
    ``[N, ...]``: ``image``, ``tokens``, ``proprio`` and the action chunk ``action``."""
    from rlinf_jax.envs.tabletop import TabletopEnv, collect_demos, demo_dataset, episode_id

    base = env.unwrapped
    if not isinstance(base, TabletopEnv):
        raise BadInput("sft.warm_start_steps with actor.model.kind=vla needs env.suite=tabletop (expert demos)")
    c = base.config
    # Episodes far from the ones reset(key) tends to draw first: the warm start should not
    # be a replay of the RL run's own first episodes.
    rng = np.random.default_rng(seed)
    num_chunks = -(-c.max_steps // c.chunk_length)
    batches = []
    for start in range(0, num_episodes, c.num_envs):
        idx = rng.integers(0, 1 << 24, size=c.num_envs)
        ids = jnp.asarray(episode_id("train", idx), jnp.int32)
        batches.append(demo_dataset(jax.jit(collect_demos, static_argnums=(0, 2))(base, ids, num_chunks)))
        del start
    data = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    if len(data["action"]) == 0:
        raise BadInput("the scripted expert solved none of the demo episodes; raise sft.num_demos")
    return data


def bc_loss(policy, model, batch):
    """Mean cross-entropy of the expert's chunk bins under the parallel decoder."""
    obs = {k: batch[k] for k in ("image", "tokens", "proprio")}
    logits, _ = model(obs)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    target = batch["bins"]
    nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
    accuracy = jnp.mean((jnp.argmax(logits, axis=-1) == target).astype(jnp.float32))
    return jnp.mean(nll), accuracy


def expert_bins(policy, actions: np.ndarray) -> np.ndarray:
    """Expert chunks ``[N, K, 7]`` -> the policy's bin indices ``[N, K * 7]``."""
    tok = policy.tokenizer
    ids = np.asarray(tok.encode(np.asarray(actions, np.float64)))
    return (ids - tok.first_id).reshape(len(actions), -1).astype(np.int32)


def bc_arrays(policy, data: dict) -> dict:
    """Demonstration steps on the device: the observation parts and the expert's bins."""
    arrays = {k: jnp.asarray(data[k]) for k in ("image", "tokens", "proprio")}
    arrays["bins"] = jnp.asarray(expert_bins(policy, data["action"]))
    return arrays


def bc_step(policy, graphdef, tx, arrays: dict, batch_size: int, params, opt_state, key):
    """One optimiser step of `bc_loss` on ``batch_size`` demonstration steps drawn with
    ``key``: ``(params, opt_state, loss, bin accuracy)``. Jittable."""
    n = arrays["bins"].shape[0]
    idx = jax.random.choice(key, n, (batch_size,), replace=False)
    batch = jax.tree.map(lambda x: x[idx], arrays)

    def loss_fn(p):
        return bc_loss(policy, nnx.merge(graphdef, p), batch)

    (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, acc


def behaviour_clone(policy, graphdef, params, data: dict, *, steps: int, lr: float, batch_size: int, seed: int, log=None):
    """``steps`` Adam steps of `bc_loss` on minibatches of ``data``; returns the new params
    and the per-step (loss, accuracy) history as numpy arrays."""
    n = len(data["action"])
    batch_size = min(batch_size, n)
    arrays = bc_arrays(policy, data)
    tx = optax.adam(lr)

    @jax.jit
    def train(params, key):
        def step(carry, k):
            p, opt, loss, acc = bc_step(policy, graphdef, tx, arrays, batch_size, *carry, k)
            return (p, opt), (loss, acc)

        (params, _), hist = jax.lax.scan(step, (params, tx.init(params)), jax.random.split(key, steps))
        return params, hist

    params, (loss, acc) = train(params, jax.random.PRNGKey(seed))
    loss, acc = np.asarray(loss), np.asarray(acc)
    if log is not None:
        log(f"warm start: {steps} behaviour-cloning steps on {n} expert steps, loss {loss[0]:.3f} -> {loss[-1]:.3f}, "
            f"bin accuracy {acc[-1]:.3f}")
    return params, loss, acc

def flow_matching_clone(policy, graphdef, params, data: dict, *, steps: int, lr: float, batch_size: int, seed: int, log=None):
    """pi0's warm start (``actor.model.kind=pi0``): ``steps`` Adam steps of the flow-matching
    loss on the expert's chunks, the objective pi0 is pre-trained with (the velocity at
    ``x_t = t * noise + (1 - t) * chunk`` regressed on ``noise - chunk``; ``t`` drawn as
    openpi draws it, ``Beta(1.5, 1) * 0.999 + 0.001``, favouring the noisy end).

    Returns the new params, the per-step loss history and the mean absolute error of the
    greedy (ODE) chunk against the expert's on up to 256 demo steps, the number that says
    whether the sampler, not just the velocity field, learned the expert."""
    n = len(data["action"])
    batch_size = min(batch_size, n)
    arrays = {k: jnp.asarray(data[k]) for k in ("image", "tokens", "proprio")}
    arrays["action"] = jnp.asarray(data["action"], jnp.float32)
    tx = optax.adam(lr)

    def loss_fn(p, batch, key):
        model = nnx.merge(graphdef, p)
        prefix, state = policy.encode(model, batch)
        actions = batch["action"]
        k_noise, k_t = jax.random.split(key)
        noise = jax.random.normal(k_noise, actions.shape, jnp.float32)
        t = jax.random.beta(k_t, 1.5, 1.0, (actions.shape[0],)) * 0.999 + 0.001
        return jnp.mean(model.flow_matching_loss(prefix, state, actions, noise, t))

    @jax.jit
    def train(params, key):
        def step(carry, k):
            p, opt = carry
            k_idx, k_loss = jax.random.split(k)
            idx = jax.random.choice(k_idx, n, (batch_size,), replace=False)
            batch = jax.tree.map(lambda x: x[idx], arrays)
            loss, grads = jax.value_and_grad(loss_fn)(p, batch, k_loss)
            updates, opt = tx.update(grads, opt, p)
            return (optax.apply_updates(p, updates), opt), loss

        (params, _), hist = jax.lax.scan(step, (params, tx.init(params)), jax.random.split(key, steps))
        return params, hist

    params, loss = train(params, jax.random.PRNGKey(seed))
    held = jax.tree.map(lambda x: x[: min(n, 256)], arrays)
    greedy = jax.jit(lambda p, obs: policy.act_deterministic(nnx.merge(graphdef, p), obs))(params, held)
    error = float(jnp.mean(jnp.abs(greedy - jnp.clip(held["action"], -1.0, 1.0))))
    loss = np.asarray(loss)
    if log is not None:
        log(f"warm start: {steps} flow-matching steps on {n} expert steps, loss {loss[0]:.3f} -> {loss[-1]:.3f}, "
            f"greedy chunk |error| {error:.3f}")
    return params, loss, error
