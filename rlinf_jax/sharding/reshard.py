"""Weight sync: move a parameter tree onto another component's shardings.

One primitive serves every placement. Collocated components with identical shardings
share arrays and copy nothing; otherwise `jax.device_put` reshards leaf by leaf, donating
the source buffers when the caller no longer needs them (the actor keeps its copy, so
actor -> rollout sync does not donate; a one-way hand-off does). With ``only``, just the
selected leaves (e.g. LoRA adapters) move and the rest of the destination tree is kept.

Donation frees each source leaf right after its copy lands, so peak memory is one leaf
more than the destination tree (a leaf whose shards the new layout keeps in place is
left to the caller to drop). `jax.device_put(..., donate=True)` itself crashed
(segfault) on CPU devices in jax 0.10.2, so it is not used.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from rlinf_jax.sharding.mesh import put


def reshard(tree, shardings, *, donate: bool = False):
    """Returns ``tree`` placed on ``shardings`` (a matching tree, or one sharding for all).

    Leaves already laid out as asked are returned as they are: same buffers, no copy.
    """
    if jax.process_count() > 1:
        # Across hosts a device-to-device copy cannot leave its process: `put` routes it
        # (without donation; the source is dropped by the caller).
        return put(tree, shardings)
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)

    moved = {}  # one buffer may sit at several leaves (XLA dedupes equal outputs): moved once

    def move(x, s):
        if isinstance(x, jax.Array) and x.sharding == s:
            return x
        if donate and isinstance(x, jax.Array):
            key = (id(x), s)
            if key not in moved:
                y = moved[key] = jax.device_put(x, s).block_until_ready()
                # A shard already on a device of the new layout may be kept, not copied:
                # then the source's buffers live on in ``y`` and are not freed here.
                if not _buffers(x) & _buffers(y):
                    x.delete()
            return moved[key]
        return jax.device_put(x, s)

    return jax.tree.map(move, tree, shardings)


def _buffers(x: jax.Array) -> set[int]:
    return {shard.data.unsafe_buffer_pointer() for shard in x.addressable_shards}


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
