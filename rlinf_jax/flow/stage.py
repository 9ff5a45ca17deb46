"""Stages: jitted functions bound to a component and its mesh.

A stage computes on its own component's devices. What it takes from another component
is moved onto its mesh first (`Stage.put`): a no-op when both components share devices
and layout, a device-to-device copy otherwise. Calls return at once (JAX's async
dispatch), so stages on disjoint devices run at the same time whenever the host has
enqueued work for both; that is all the pipelining there is, no threads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
from jax.sharding import Mesh

from rlinf_jax.sharding import batch_sharding, replicated

# The device components an env-stepping run places: the env batch, the rollout acting on
# it, and the actor (the learner, with the replay buffer where there is one).
COMPONENTS = ("env", "rollout", "actor")


@dataclass(frozen=True)
class Stage:
    name: str
    component: str
    mesh: Mesh
    fn: Callable

    @classmethod
    def create(cls, name: str, component: str, mesh: Mesh, fn: Callable, donate_argnums=()) -> "Stage":
        return cls(name, component, mesh, jax.jit(fn, donate_argnums=donate_argnums))

    def __call__(self, *args):
        return self.fn(*args)

    def put(self, tree, batch_dim: int | None = None):
        """Places ``tree`` on this stage's mesh: split along ``batch_dim`` or replicated."""
        target = replicated(self.mesh) if batch_dim is None else batch_sharding(self.mesh, batch_dim)
        return jax.tree.map(lambda x: x if getattr(x, "sharding", None) == target else jax.device_put(x, target), tree)

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(int(d.id) for d in self.mesh.devices.flat)
