"""Weight sync: move a parameter tree onto another component's shardings.

One primitive serves every placement. Collocated components with identical shardings
share arrays and copy nothing; otherwise `jax.device_put` reshards leaf by leaf, donating
the source buffers when the caller no longer needs them (the actor keeps its copy, so
actor -> rollout sync does not donate; a one-way hand-off does). With ``only``, just the
selected leaves (e.g. LoRA adapters) move and the rest of the destination tree is kept.

Donation frees each source leaf right after its copy lands, so peak memory is one leaf
more than the destination tree. `jax.device_put(..., donate=True)` itself crashed
(segfault) on CPU devices in jax 0.10.2, so it is not used.
"""

from __future__ import annotations

from collections.abc import Callable

import jax


def reshard(tree, shardings, *, donate: bool = False):
    """Returns ``tree`` placed on ``shardings`` (a matching tree, or one sharding for all).

    Leaves already laid out as asked are returned as they are: same buffers, no copy.
    """
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)

    def move(x, s):
        if isinstance(x, jax.Array) and x.sharding == s:
            return x
        y = jax.device_put(x, s)
        if donate and isinstance(x, jax.Array):
            y.block_until_ready()
            x.delete()
        return y

    return jax.tree.map(move, tree, shardings)


def sync_weights(src, dst, *, only: Callable[[tuple, jax.Array], bool] | None = None, donate: bool = False):
    """Copies ``src``'s values into the layout of ``dst`` (same tree structure).

    ``only(path, leaf) -> bool`` picks the leaves that move (trainable subset); the others
    keep ``dst``'s arrays.
    """
    dst_shardings = jax.tree.map(lambda x: x.sharding, dst)
    if only is None:
        return reshard(src, dst_shardings, donate=donate)
    return jax.tree_util.tree_map_with_path(
        lambda path, s, d, sh: reshard(s, sh, donate=donate) if only(path, s) else d, src, dst, dst_shardings
    )
