"""Optimisers and the one guarded update every trainer and cloning loop takes.

A step whose loss or gradients are not all finite never reaches the parameters or the
optimiser state: the update is checked and either taken whole or dropped whole, inside the
jitted step. Callers count the dropped steps
(``train/skipped_updates``) and the host loop stops a run that keeps dropping them
(`rlinf_jax.flow.host_loop.TrainingDiverged`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def finite(tree) -> jax.Array:
    """True when every leaf of ``tree`` is finite."""
    return jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def select(pred, new, old):
    """``new`` where ``pred`` else ``old``, leaf by leaf."""
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def guarded_update(tx: optax.GradientTransformation, grads, params, opt_state, loss):
    """``tx``'s update of ``params`` by ``grads``, taken only when it is finite.

    Returns ``(params, opt_state, ok)``; with ``ok`` False both come back unchanged.

    ``ok`` is two scalars: the loss and the gradients' global norm are finite. A finite norm
    bounds every gradient and its square, so the clipped Adam/AdamW chains built below keep
    finite moments and take a finite step, and finite parameters stay finite. The update
    runs under ``lax.cond``, so a dropped step costs nothing and a taken one costs what the
    bare update costs: checking every leaf of the new parameters and selecting leaf by leaf
    between old and new was dozens of small kernels per step, about a fifth of a SAC
    gradient step's time on a CPU (benchmarks/README.md, sac_vs_brax).
    """
    ok = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm(grads))

    def take():
        updates, new_opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_opt_state

    params, opt_state = jax.lax.cond(ok, take, lambda: (params, opt_state))
    return params, opt_state, ok


def _clip(max_grad_norm: float) -> list:
    # 0 turns clipping off; the chain keeps one shape per setting.
    return [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm > 0 else []


def clipped_adam(lr: float, max_grad_norm: float, schedule: str = "constant", total_steps: int = 1, b1: float = 0.9):
    """Global-norm clipping (none for ``max_grad_norm=0``) + Adam; ``schedule="linear"``
    decays the rate to 0 over ``total_steps`` updates."""
    rate = lr if schedule == "constant" else optax.linear_schedule(lr, 0.0, total_steps)
    return optax.chain(*_clip(max_grad_norm), optax.adam(rate, b1=b1))


def clipped_adamw(lr: float, max_grad_norm: float, weight_decay: float, warmup_steps: int,
                  schedule: str = "constant", total_steps: int = 1):
    """Global-norm clipping + AdamW with an optional linear warm-up and linear decay.

    Returns ``(transform, schedule)``; the schedule is logged as ``train/lr``.
    """
    decay_steps = max(int(total_steps) - int(warmup_steps), 1)
    tail = optax.linear_schedule(lr, 0.0, decay_steps) if schedule == "linear" else optax.constant_schedule(lr)
    sched = optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps), tail], [warmup_steps]) if warmup_steps else tail
    return optax.chain(*_clip(max_grad_norm), optax.adamw(sched, weight_decay=weight_decay)), sched
