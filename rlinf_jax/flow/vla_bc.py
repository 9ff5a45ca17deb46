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


def chunks_per_episode(env) -> int:
    """Policy calls in one episode of the base `TabletopEnv` (the last chunk may be short)."""
    c = env.config
    return -(-c.max_steps // c.chunk_length)


def train_episode_ids(rng: np.random.Generator, num_envs: int) -> jax.Array:
    """``num_envs`` training-split episode ids drawn with ``rng`` (int32, on the device)."""
    from rlinf_jax.envs.tabletop import episode_id

    return jnp.asarray(episode_id("train", rng.integers(0, 1 << 24, size=num_envs)), jnp.int32)


def expert_demos(env, num_episodes: int, seed: int) -> dict[str, np.ndarray]:
    """Successful expert steps of ``num_episodes`` training episodes as numpy arrays
    ``[N, ...]``: ``image``, ``tokens``, ``proprio`` and the action chunk ``action``."""
    from rlinf_jax.envs.tabletop import TabletopEnv, collect_demos, demo_dataset

    base = env.unwrapped
    if not isinstance(base, TabletopEnv):
        raise BadInput("sft.warm_start_steps with actor.model.kind=vla needs env.suite=tabletop (expert demos)")
    c = base.config
    # Episodes far from the ones reset(key) tends to draw first: the warm start should not
    # be a replay of the RL run's own first episodes.
    rng = np.random.default_rng(seed)
    collect = jax.jit(collect_demos, static_argnums=(0, 2))
    batches = [
        demo_dataset(collect(base, train_episode_ids(rng, c.num_envs), chunks_per_episode(base)))
        for _ in range(0, num_episodes, c.num_envs)
    ]
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


def bc_step(policy, graphdef, tx, arrays: dict, batch_size: int, params, opt_state, key, rows=None):
    """One optimiser step of `bc_loss` on ``batch_size`` demonstration steps drawn with
    ``key``: ``(params, opt_state, loss, bin accuracy)``. Jittable. ``rows`` (a traced
    int): only the first ``rows`` of padded ``arrays`` are data, drawn with replacement."""
    n = arrays["bins"].shape[0]
    if rows is None:
        idx = jax.random.choice(key, n, (batch_size,), replace=False)
    else:
        idx = jax.random.randint(key, (batch_size,), 0, rows)
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


# ---------------------------------------------------------------------------- DAgger
# Cloning the expert's own trajectories teaches the policy only the states the expert
# visits; a policy a few millimetres off that path meets states it never saw and drifts
# (measured on the tabletop: 11-12 cm from the object after the first chunk). DAgger
# (Ross et al., 2011) rolls the current policy out, asks the expert what it would do in
# every state the policy visited (the expert is a function of the sim state) and clones
# the aggregate of all rounds' data, so the data covers the policy's own mistakes.


def policy_visits(env, policy, graphdef, params, episode_ids, num_chunks: int, key, greedy: bool):
    """Roll ``policy`` out from ``env.reset_to(episode_ids)`` (the base `TabletopEnv`) for
    ``num_chunks`` chunks and label every visited state with the expert's chunk. Jittable.

    Returns records with axes ``[num_envs, num_chunks, ...]``: ``image``, ``tokens``,
    ``proprio`` (what the policy saw), ``action`` (the expert's chunk for that state),
    ``valid`` (the state came before the episode ended or succeeded), ``live`` (before the
    episode ended, success or not) and ``reward`` (the env's reward for the policy's
    chunk); and ``success`` ``[num_envs]``: whether the policy's own episode succeeded.
    """
    from rlinf_jax.envs.tabletop.expert import expert_actions

    model = nnx.merge(graphdef, params)
    state = env.reset_to(episode_ids)
    n = state.reward.shape[0]

    def body(carry, k):
        state, finished, ended, succeeded = carry
        if greedy:
            act = policy.act_deterministic(model, state.obs)
        else:
            act = policy.act(model, state.obs, jax.random.split(k, n))[0]
        nxt = env.step(state, act)
        rec = {**state.obs, "action": expert_actions(env, state), "valid": ~finished, "live": ~ended, "reward": nxt.reward}
        succeeded = succeeded | (~finished & (nxt.info["success"] > 0))
        finished = finished | (nxt.done > 0) | (nxt.info["success"] > 0)
        ended = ended | (nxt.done > 0)
        return (nxt, finished, ended, succeeded), rec

    no = jnp.zeros(n, bool)
    (_, _, _, success), recs = jax.lax.scan(body, (state, no, no, no), jax.random.split(key, num_chunks))
    recs = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), recs)
    return {**recs, "success": success}


def policy_visitor(env, policy, graphdef, greedy: bool):
    """`policy_visits` on ``env``'s base `TabletopEnv` for whole episodes, jitted:
    ``(params, episode ids, key) -> records``."""
    base = env.unwrapped
    num_chunks = chunks_per_episode(base)
    return jax.jit(lambda p, ids, k: policy_visits(base, policy, graphdef, p, ids, num_chunks, k, greedy))


def visited_batches(env, visit, params, num_episodes: int, rng: np.random.Generator, key, first: int = 0):
    """``visit`` on ``num_episodes`` training-split episodes (rounded up to whole env
    batches) drawn with ``rng``; batch ``i`` samples with ``fold_in(key, first + i)``.
    Yields each batch's records on the host."""
    n = env.unwrapped.config.num_envs
    for i in range(-(-num_episodes // n)):
        yield jax.device_get(visit(params, train_episode_ids(rng, n), jax.random.fold_in(key, first + i)))


def dagger_capacity(env, num_steps: int, rounds: int, episodes: int) -> int:
    """Rows that ``num_steps`` demonstration steps plus ``rounds`` DAgger rounds of
    ``episodes`` episodes can fill at most (every chunk of every visited episode)."""
    c = env.unwrapped.config
    per_round = -(-episodes // c.num_envs) * c.num_envs * chunks_per_episode(env.unwrapped)
    return num_steps + rounds * per_round


def dagger_data(env, visit, params, num_episodes: int, seed: int):
    """``visit`` (a `policy_visitor`) on ``num_episodes`` training-split episodes drawn
    with ``seed``: ``(steps, success rate)``, the steps as numpy arrays ``[N, ...]`` like
    `expert_demos`'s (every valid visited state, whether or not the policy's episode
    succeeded)."""
    steps, success = [], []
    for host in visited_batches(env, visit, params, num_episodes, np.random.default_rng(seed), jax.random.PRNGKey(seed)):
        keep = np.asarray(host["valid"], bool)
        steps.append({k: np.asarray(host[k])[keep] for k in ("image", "tokens", "proprio", "action")})
        success.append(np.asarray(host["success"], np.float32))
    data = {k: np.concatenate([s[k] for s in steps]) for k in steps[0]}
    return data, float(np.mean(np.concatenate(success)))


def pad_steps(policy, data: dict, capacity: int) -> dict:
    """`bc_arrays` of ``data`` zero-padded to ``capacity`` rows, so datasets that grow
    round by round keep one shape (one compiled cloning program)."""
    arrays = bc_arrays(policy, data)
    n = arrays["bins"].shape[0]
    return jax.tree.map(lambda x: jnp.concatenate([x, jnp.zeros((capacity - n, *x.shape[1:]), x.dtype)]), arrays)


def make_clone_steps(policy, graphdef, tx, batch_size: int):
    """A jitted ``(params, opt_state, arrays, n, num_steps, key) -> (params, opt_state,
    mean loss, mean accuracy)``: Adam steps of `bc_loss` on minibatches drawn (with
    replacement) from the first ``n`` rows of the padded ``arrays``."""

    def run(params, opt_state, arrays, n, num_steps, key):
        def step(i, carry):
            p, opt, loss_sum, acc_sum = carry
            p, opt, loss, acc = bc_step(policy, graphdef, tx, arrays, batch_size, p, opt, jax.random.fold_in(key, i), rows=n)
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
    clone = make_clone_steps(policy, graphdef, tx, min(batch_size, len(data["action"])))
    visit = policy_visitor(env, policy, graphdef, greedy)
    data = {k: data[k] for k in ("image", "tokens", "proprio", "action")}
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


def discounted_returns(reward: np.ndarray, live: np.ndarray, gamma: float) -> np.ndarray:
    """``[B, T]`` rewards of episodes (``live`` marks steps before the end) -> the
    discounted return from each step to the episode's end."""
    out = np.zeros_like(reward, np.float32)
    acc = np.zeros(reward.shape[0], np.float32)
    for t in range(reward.shape[1] - 1, -1, -1):
        acc = np.where(live[:, t], reward[:, t] + gamma * acc, 0.0)
        out[:, t] = acc
    return out


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
        obs.append({k: np.asarray(host[k])[live] for k in ("image", "tokens", "proprio")})
        targets.append(ret[live])
    arrays = {k: jnp.asarray(np.concatenate([o[k] for o in obs])) for k in obs[0]}
    target = jnp.asarray(np.concatenate(targets))
    n = target.shape[0]
    mask = jax.tree_util.tree_map_with_path(lambda path, _: getattr(path[0], "key", None) == "value", params)
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
                _, value = nnx.merge(graphdef, q)(batch)
                return jnp.mean((value - target[idx]) ** 2)

            loss, grads = jax.value_and_grad(loss_fn)(p)
            updates, opt = tx.update(grads, opt, p)
            return (optax.apply_updates(p, updates), opt), loss

        (params, _), hist = jax.lax.scan(step, (params, tx.init(params)), jax.random.split(key, steps))
        return params, hist

    params, hist = train(params, jax.random.PRNGKey(seed + 2))
    err = float(np.mean(np.asarray(hist[-max(1, steps // 10):])))
    if log is not None:
        log(f"critic warm-up: {steps} steps on the returns of {n} sampled policy steps "
            f"(mean return {float(jnp.mean(target)):.3f}), value MSE {float(hist[0]):.3f} -> {err:.3f}")
    return params, err
