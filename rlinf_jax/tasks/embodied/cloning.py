"""Imitation loops for the tabletop's VLA policies: behaviour cloning (plain or with DAgger
rounds), pi0's flow matching, and a critic warm-up fitting the value head alone.

They are the warm starts RL fine-tuning needs (a random VLA never completes a
pick-and-place, so PPO and GRPO would have no success to reinforce) and the steps of the
``sft_vla_tabletop`` run. Every optimiser step is the guarded one
(`rlinf_jax.flow.optim.guarded_update`): a non-finite step is dropped and counted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rlinf_jax.algos.imitation import discounted_returns, token_nll
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.optim import clipped_adam, guarded_update
from rlinf_jax.envs.tabletop.visits import (
    OBS_KEYS,
    STEP_KEYS,
    dagger_capacity,
    dagger_data,
    policy_visitor,
    visited_batches,
)


def sft_optimizer(cfg: Config):
    """The cloning optimiser of an SFT run (and the state its checkpoints hold)."""
    return clipped_adam(cfg.sft.lr, cfg.actor.optim.max_grad_norm)


def expert_bins(policy, actions: np.ndarray) -> np.ndarray:
    """Expert chunks ``[N, K, 7]`` -> the policy's bin indices ``[N, K * 7]``."""
    tok = policy.tokenizer
    ids = np.asarray(tok.encode(np.asarray(actions, np.float64)))
    return (ids - tok.first_id).reshape(len(actions), -1).astype(np.int32)


def bc_arrays(policy, data: dict) -> dict:
    """Demonstration steps on the device: the observation parts and the expert's bins."""
    arrays = {k: jnp.asarray(data[k]) for k in OBS_KEYS}
    arrays["bins"] = jnp.asarray(expert_bins(policy, data["action"]))
    return arrays


def bc_loss(model, batch):
    """Mean cross-entropy of the expert's chunk bins under the parallel decoder, and the
    greedy bins' accuracy."""
    logits, _ = model({k: batch[k] for k in OBS_KEYS})
    return token_nll(logits, batch["bins"])


def bc_step(graphdef, tx, arrays: dict, batch_size: int, params, opt_state, key, rows=None):
    """One guarded optimiser step of `bc_loss` on ``batch_size`` demonstration steps drawn
    with ``key``: ``(params, opt_state, loss, bin accuracy, ok)``. Jittable. ``rows`` (a
    traced int): only the first ``rows`` of padded ``arrays`` are data, drawn with
    replacement."""
    n = arrays["bins"].shape[0]
    if rows is None:
        idx = jax.random.choice(key, n, (batch_size,), replace=False)
    else:
        idx = jax.random.randint(key, (batch_size,), 0, rows)
    batch = jax.tree.map(lambda x: x[idx], arrays)
    (loss, acc), grads = jax.value_and_grad(lambda p: bc_loss(nnx.merge(graphdef, p), batch), has_aux=True)(params)
    params, opt_state, ok = guarded_update(tx, grads, params, opt_state, loss)
    return params, opt_state, loss, acc, ok


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
            p, opt, loss, acc, _ = bc_step(graphdef, tx, arrays, batch_size, *carry, k)
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
    """pi0's warm start: ``steps`` Adam steps of the flow-matching loss on the expert's
    chunks, the objective pi0 is pre-trained with (the velocity at ``x_t = t * noise +
    (1 - t) * chunk`` regressed on ``noise - chunk``).

    Returns the new params, the per-step loss history and the mean absolute error of the
    greedy (ODE) chunk against the expert's on up to 256 demo steps, the number that says
    whether the sampler, not just the velocity field, learned the expert."""
    n = len(data["action"])
    batch_size = min(batch_size, n)
    arrays = {k: jnp.asarray(data[k]) for k in OBS_KEYS}
    arrays["action"] = jnp.asarray(data["action"], jnp.float32)
    tx = optax.adam(lr)

    def loss_fn(p, batch, key):
        model = nnx.merge(graphdef, p)
        prefix, state = policy.encode(model, batch)
        actions = batch["action"]
        k_noise, k_t = jax.random.split(key)
        noise = jax.random.normal(k_noise, actions.shape, jnp.float32)
        t = model.training_times(k_t, actions.shape[0])
        return jnp.mean(model.flow_matching_loss(prefix, state, actions, noise, t))

    @jax.jit
    def train(params, key):
        def step(carry, k):
            p, opt = carry
            k_idx, k_loss = jax.random.split(k)
            idx = jax.random.choice(k_idx, n, (batch_size,), replace=False)
            batch = jax.tree.map(lambda x: x[idx], arrays)
            loss, grads = jax.value_and_grad(loss_fn)(p, batch, k_loss)
            p, opt, _ = guarded_update(tx, grads, p, opt, loss)
            return (p, opt), loss

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


# ---------------------------------------------------------------------------- DAgger


def pad_steps(policy, data: dict, capacity: int) -> dict:
    """`bc_arrays` of ``data`` zero-padded to ``capacity`` rows, so datasets that grow
    round by round keep one shape (one compiled cloning program)."""
    arrays = bc_arrays(policy, data)
    n = arrays["bins"].shape[0]
    return jax.tree.map(lambda x: jnp.concatenate([x, jnp.zeros((capacity - n, *x.shape[1:]), x.dtype)]), arrays)


def make_clone_steps(graphdef, tx, batch_size: int):
    """A jitted ``(params, opt_state, arrays, n, num_steps, key) -> (params, opt_state,
    mean loss, mean accuracy)``: Adam steps of `bc_loss` on minibatches drawn (with
    replacement) from the first ``n`` rows of the padded ``arrays``."""

    def run(params, opt_state, arrays, n, num_steps, key):
        def step(i, carry):
            p, opt, loss_sum, acc_sum = carry
            p, opt, loss, acc, _ = bc_step(graphdef, tx, arrays, batch_size, p, opt, jax.random.fold_in(key, i), rows=n)
            return p, opt, loss_sum + loss, acc_sum + acc

        zero = jnp.zeros((), jnp.float32)
        params, opt_state, loss, acc = jax.lax.fori_loop(0, num_steps, step, (params, opt_state, zero, zero))
        return params, opt_state, loss / num_steps, acc / num_steps

    return jax.jit(run)


def dagger_clone(
    policy, graphdef, params, env, data: dict, *, steps: int, lr: float, batch_size: int, seed: int,
    rounds: int, episodes: int, round_steps: int, greedy: bool = True, log=None,
):
    """Behaviour cloning with DAgger: ``steps`` Adam steps on the expert's ``data``, then
    ``rounds`` times: roll the policy out on ``episodes`` new training-split episodes
    (`policy_visits`, greedy or sampled), add every visited state labelled with the
    expert's chunk, and take ``round_steps`` more steps on the aggregate (one Adam state
    throughout). Returns the params and a history dict: ``loss`` / ``accuracy`` (mean of
    each phase) and ``success`` (the policy's success on each round's episodes, i.e.
    before that round's cloning)."""
    if rounds < 1 or episodes < 1 or round_steps < 1:
        raise BadInput("DAgger needs sft.dagger_rounds, sft.dagger_episodes and sft.dagger_steps >= 1")
    capacity = dagger_capacity(env, len(data["action"]), rounds, episodes)
    tx = optax.adam(lr)
    opt_state = tx.init(params)
    clone = make_clone_steps(graphdef, tx, min(batch_size, len(data["action"])))
    visit = policy_visitor(env, policy, graphdef, greedy)
    data = {k: data[k] for k in STEP_KEYS}
    key = jax.random.PRNGKey(seed)
    hist = {"loss": [], "accuracy": [], "success": []}
    for r in range(rounds + 1):
        if r:
            new, success = dagger_data(env, visit, params, episodes, seed * 1000 + r)
            data = {k: np.concatenate([data[k], new[k]]) for k in data}
            hist["success"].append(success)
        n = len(data["action"])
        params, opt_state, loss, acc = clone(
            params, opt_state, pad_steps(policy, data, capacity), n, round_steps if r else steps, jax.random.fold_in(key, r)
        )
        hist["loss"].append(float(loss))
        hist["accuracy"].append(float(acc))
        if log is not None:
            seen = f", policy success on its {episodes} episodes {hist['success'][-1]:.3f}" if r else ""
            log(f"warm start {'DAgger round ' + str(r) if r else 'cloning'}: {n} steps of data{seen}, "
                f"loss {loss:.3f}, bin accuracy {acc:.3f}")
    return params, hist


# ------------------------------------------------------------------ critic warm-up
# A value head that starts at zero makes GAE's advantages the returns-to-go themselves, and
# with dense rewards those fall with the time step in every episode: normalised, they push
# up every early chunk and down every late one (placing, releasing) whatever the episode's
# quality. Measured on the tabletop, PPO from a cloned policy then unlearned it (greedy
# success 56% -> 6% in 300 iterations). Fitting the value head to the cloned policy's own
# discounted returns before PPO removes that bias; the rest of the model is frozen, so the
# warm-started policy is exactly the cloned one.


# The value head's top-level name in each VLA family (OpenVLA's `value`; the flow models' `value_head`).
VALUE_HEADS = ("value", "value_head")


def fit_value_head(policy, graphdef, params, env, *, episodes: int, steps: int, lr: float, batch_size: int,
                   gamma: float, reward_scale: float, seed: int, log=None):
    """Regress the value head (only) on the discounted, scaled returns of the policy's own
    sampled episodes (``episodes`` training-split episodes, sampled as the RL rollout
    samples). Returns the params (every other leaf untouched) and the final mean squared
    error."""
    visit = policy_visitor(env, policy, graphdef, greedy=False)
    obs, targets = [], []
    rng, key = np.random.default_rng(seed + 1), jax.random.PRNGKey(seed)
    for host in visited_batches(env, visit, params, episodes, rng, key, first=7):
        live = np.asarray(host["live"], bool)
        ret = discounted_returns(np.asarray(host["reward"], np.float32) * reward_scale, live, gamma)
        obs.append({k: np.asarray(host[k])[live] for k in OBS_KEYS})
        targets.append(ret[live])
    arrays = {k: jnp.asarray(np.concatenate([o[k] for o in obs])) for k in obs[0]}
    target = jnp.asarray(np.concatenate(targets))
    n = target.shape[0]
    mask = jax.tree_util.tree_map_with_path(lambda path, _: getattr(path[0], "key", None) in VALUE_HEADS, params)
    tx = optax.masked(optax.adam(lr), mask)

    @jax.jit
    def train(params, key):
        def step(carry, k):
            p, opt = carry
            idx = jax.random.randint(k, (min(batch_size, n),), 0, n)
            batch = jax.tree.map(lambda x: x[idx], arrays)

            def loss_fn(q):
                # Frozen leaves are constants: their gradients are exact zeros, and the
                # backward pass stops at the value head instead of running the backbone's.
                q = jax.tree.map(lambda x, m: x if m else jax.lax.stop_gradient(x), q, mask)
                value = policy.critic(nnx.merge(graphdef, q), batch)
                return jnp.mean((value - target[idx]) ** 2)

            loss, grads = jax.value_and_grad(loss_fn)(p)
            p, opt, _ = guarded_update(tx, grads, p, opt, loss)
            return (p, opt), loss

        (params, _), hist = jax.lax.scan(step, (params, tx.init(params)), jax.random.split(key, steps))
        return params, hist

    params, hist = train(params, jax.random.PRNGKey(seed + 2))
    err = float(np.mean(np.asarray(hist[-max(1, steps // 10):])))
    if log is not None:
        log(f"critic warm-up: {steps} steps on the returns of {n} sampled policy steps "
            f"(mean return {float(jnp.mean(target)):.3f}), value MSE {float(hist[0]):.3f} -> {err:.3f}")
    return params, err
