"""Episode ids: one integer decodes into everything an episode is made of.

An id is ``split_code * SPLIT_SIZE + index``, so the splits' id ranges are disjoint by
construction; the index, folded into a fixed key, draws the episode's factors from the
distribution of its split (see `catalog` for which values each split may use). Decoding is
a pure jittable function, so a batch of ids resets a batch of envs inside `jit`, and envs
that share an id (a GRPO group) start from the same state.

Positions come from grid cells: the object, the two pads and a distractor take distinct
cells (a permutation) and are jittered inside them, which keeps them apart without
rejection sampling. Training cells cover the inner 3x3 grid (the training region); the
execution split uses the 16 cells of the ring around it.

Layouts (`LAYOUTS`, the env's ``layout`` setting): ``random`` draws the cells and the other
pad per episode, so the policy must find the object and the pads in the image. ``task``
fixes them per task (object, target), LIBERO's way: every episode of "put the red cube on
the white pad" has the same cells, only the +-1.2 cm jitter, the table's look, the
template and the start pose vary. It is the easier benchmark small policies can learn
from a few hundred demonstrations; the test splits stay out of distribution (unseen
textures; unseen objects, hence unseen layouts, with a distractor; the execution split
still draws ring cells per episode).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rlinf_jax.envs.tabletop import catalog, language
from rlinf_jax.errors import BadInput

SPLITS = ("train", "vision", "semantic", "execution")
LAYOUTS = ("random", "task")
SPLIT_SIZE = 1 << 24  # ids per split
_ROOT_SEED = 0x7AB1E

_GRID_X = np.array([-0.2, -0.1, 0.0, 0.1, 0.2], np.float32)
_GRID_Y = np.array([-0.18, -0.09, 0.0, 0.09, 0.18], np.float32)
_CELLS = np.array([(x, y) for y in _GRID_Y for x in _GRID_X], np.float32)  # 25 cells
_INNER = np.array([(np.abs(c[0]) < 0.15) & (np.abs(c[1]) < 0.12) for c in _CELLS])
INNER_CELLS = _CELLS[_INNER]  # 3x3: the training region
RING_CELLS = _CELLS[~_INNER]  # 16 cells around it
JITTER = 0.012
# The training region: every training position lies inside it, every execution-split
# object and target position outside it.
TRAIN_REGION = (0.1 + JITTER, 0.09 + JITTER)

EE_HOME = np.array([0.0, -0.16, 0.2], np.float32)
EE_JITTER = 0.02  # training: uniform in +-2 cm per axis
EE_PERTURB = (0.05, 0.09)  # execution: |offset| per axis in this range, random sign
MOVE_STEPS = (6, 14)  # execution: the object jumps at a sub-step in this range


@struct.dataclass
class EpisodeSpec:
    """Everything about an episode, as arrays (leaves get a batch axis when batched)."""

    episode_id: jax.Array  # int32
    split: jax.Array  # int32 index into SPLITS
    obj: jax.Array  # int32 index into catalog.OBJECTS
    target: jax.Array  # int32 index into catalog.PADS (pad 0 is the target)
    other_pad: jax.Array  # int32 index into catalog.PADS (pad 1)
    distractor: jax.Array  # int32 index into catalog.OBJECTS, -1 for none
    texture: jax.Array  # int32 index into catalog.TEXTURES
    background: jax.Array  # int32 index into catalog.BACKGROUNDS
    template: jax.Array  # int32 index into catalog.TEMPLATES
    obj_xy: jax.Array  # [2]
    pad_xy: jax.Array  # [2, 2]: target pad, other pad
    distractor_xy: jax.Array  # [2]
    ee_init: jax.Array  # [3]
    move_step: jax.Array  # int32 sub-step at which the object jumps, -1 for never
    move_xy: jax.Array  # [2]
    tokens: jax.Array  # int32 [language.MAX_TOKENS]


def split_code(split: str) -> int:
    if split not in SPLITS:
        raise BadInput(f"unknown tabletop split {split!r}; choose one of {', '.join(SPLITS)}")
    return SPLITS.index(split)


def episode_id(split: str, index) -> np.ndarray | int:
    """The global id of episode `index` (int or int array in [0, SPLIT_SIZE)) of `split`."""
    code = split_code(split)
    idx = np.asarray(index)
    if np.any(idx < 0) or np.any(idx >= SPLIT_SIZE):
        raise BadInput(f"tabletop episode index must be in [0, {SPLIT_SIZE}), got {index!r}")
    out = code * SPLIT_SIZE + idx.astype(np.int64)
    return int(out) if out.ndim == 0 else out.astype(np.int32)


def split_of(eid: int) -> tuple[str, int]:
    """(split, index) of a global episode id (host side, checked)."""
    eid = int(eid)
    if not 0 <= eid < len(SPLITS) * SPLIT_SIZE:
        raise BadInput(f"tabletop episode id must be in [0, {len(SPLITS) * SPLIT_SIZE}), got {eid}")
    return SPLITS[eid // SPLIT_SIZE], eid % SPLIT_SIZE


def _pick(u: jax.Array, lo: int, hi: int) -> jax.Array:
    """An int32 in [lo, hi) from a uniform u in [0, 1)."""
    return jnp.minimum(lo + jnp.floor(u * (hi - lo)), hi - 1).astype(jnp.int32)


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise BadInput(f"unknown tabletop layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    return layout


def decode(eid, layout: str = "random") -> EpisodeSpec:
    """Jittable: an int32 episode id -> its `EpisodeSpec` (unbatched; vmap for batches).

    ``layout`` (static) is one of `LAYOUTS`, see the module docstring. Out-of-range ids are
    clipped to the valid range; `split_of` checks ids on the host.
    """
    check_layout(layout)
    eid = jnp.clip(jnp.asarray(eid, jnp.int32), 0, len(SPLITS) * SPLIT_SIZE - 1)
    split = eid // SPLIT_SIZE
    vision, semantic, execution = split == 1, split == 2, split == 3
    # One draw of uniforms feeds every factor (cheap to compile, unlike a key per factor):
    # [0:6] choices, [6:22] cell order, [22:32] jitter, [32:41] pose, [41:45] pads, [45:69] distractor.
    u = jax.random.uniform(jax.random.fold_in(jax.random.PRNGKey(_ROOT_SEED), eid), (69,))

    n_obj, n_obj_train = len(catalog.OBJECTS), catalog.NUM_TRAIN_OBJECTS
    obj = jnp.where(semantic, _pick(u[0], n_obj_train, n_obj), _pick(u[0], 0, n_obj_train))
    # A distractor of another shape (so it has a body of its own), from the whole catalogue.
    slot = jnp.asarray(catalog.OBJECT_SLOT)
    score = jnp.where(slot != slot[obj], u[45:69], -1.0)
    distractor = jnp.where(semantic, jnp.argmax(score), -1).astype(jnp.int32)

    pads = jnp.argsort(u[41:45])
    target, other_pad = pads[0].astype(jnp.int32), pads[1].astype(jnp.int32)
    if layout == "task":
        # The task's own draw (keyed by object and target, never by the episode) replaces
        # the episode's for the cell order and the other pad; the jitter stays per episode.
        task = obj * len(catalog.PADS) + target
        v = jax.random.uniform(jax.random.fold_in(jax.random.PRNGKey(_ROOT_SEED + 1), task), (69,))
        score = jnp.where(jnp.arange(len(catalog.PADS)) == target, -1.0, v[41:45])
        other_pad = jnp.argmax(score).astype(jnp.int32)
        u = u.at[6:22].set(jnp.where(execution, u[6:22], v[6:22]))

    nt, ntt = len(catalog.TEXTURES), catalog.NUM_TRAIN_TEXTURES
    texture = jnp.where(vision, _pick(u[1], ntt, nt), _pick(u[1], 0, ntt))
    nb, nbt = len(catalog.BACKGROUNDS), catalog.NUM_TRAIN_BACKGROUNDS
    background = jnp.where(vision, _pick(u[2], nbt, nb), _pick(u[2], 0, nbt))
    nm, nmt = len(catalog.TEMPLATES), catalog.NUM_TRAIN_TEMPLATES
    template = jnp.where(semantic, _pick(u[3], nmt, nm), _pick(u[3], 0, nmt))

    # Positions: object, target pad, other pad, distractor, then where the object jumps to.
    inner = jnp.asarray(INNER_CELLS)[jnp.argsort(u[6 : 6 + len(INNER_CELLS)])[:5]]
    ring = jnp.asarray(RING_CELLS)[jnp.argsort(u[6 : 6 + len(RING_CELLS)])[:5]]
    cells = jnp.where(execution, ring, inner)
    xy = cells + (2 * u[22:32].reshape(5, 2) - 1) * JITTER

    ee_jitter = (2 * u[32:35] - 1) * EE_JITTER
    mag = EE_PERTURB[0] + u[35:38] * (EE_PERTURB[1] - EE_PERTURB[0])
    sign = jnp.where(u[38:41] < 0.5, 1.0, -1.0)
    ee_init = jnp.asarray(EE_HOME) + jnp.where(execution, mag * sign, ee_jitter)

    move_step = jnp.where(execution, _pick(u[4], MOVE_STEPS[0], MOVE_STEPS[1] + 1), -1)
    tokens = jnp.asarray(language.token_table())[template, obj, target]
    return EpisodeSpec(
        episode_id=eid,
        split=split.astype(jnp.int32),
        obj=obj.astype(jnp.int32),
        target=target,
        other_pad=other_pad,
        distractor=distractor,
        texture=texture.astype(jnp.int32),
        background=background.astype(jnp.int32),
        template=template.astype(jnp.int32),
        obj_xy=xy[0],
        pad_xy=xy[1:3],
        distractor_xy=xy[3],
        ee_init=ee_init.astype(jnp.float32),
        move_step=move_step.astype(jnp.int32),
        move_xy=xy[4],
        tokens=tokens,
    )


decode_one = jax.jit(decode, static_argnames="layout")
decode_batch = jax.jit(jax.vmap(decode, in_axes=(0, None)), static_argnums=1)


def episode_spec(split: str, index, layout: str = "random") -> EpisodeSpec:
    """(split, index) -> spec; `index` may be an int or an int array (batched spec)."""
    ids = episode_id(split, index)
    if np.ndim(ids) == 0:
        return decode_one(jnp.asarray(ids, jnp.int32), layout=layout)
    return decode_batch(jnp.asarray(ids, jnp.int32), layout)


def instruction(eid: int) -> str:
    """The raw instruction text of an episode (host side, for language-model tokenizers)."""
    split_of(eid)
    spec = jax.device_get(decode_batch(jnp.asarray([int(eid)], jnp.int32), "random"))
    return catalog.instruction_text(int(spec.template[0]), int(spec.obj[0]), int(spec.target[0]))


def describe(eid: int, layout: str = "random") -> dict:
    """A plain-Python summary of an episode's factors (for logs, docs and tests)."""
    split, index = split_of(eid)
    s = jax.device_get(decode_batch(jnp.asarray([int(eid)], jnp.int32), layout))
    d = int(s.distractor[0])
    return {
        "episode_id": int(eid),
        "split": split,
        "index": index,
        "object": catalog.OBJECT_NAMES[int(s.obj[0])],
        "target": catalog.PAD_NAMES[int(s.target[0])],
        "other_pad": catalog.PAD_NAMES[int(s.other_pad[0])],
        "distractor": catalog.OBJECT_NAMES[d] if d >= 0 else None,
        "texture": int(s.texture[0]),
        "background": int(s.background[0]),
        "template": int(s.template[0]),
        "instruction": catalog.instruction_text(int(s.template[0]), int(s.obj[0]), int(s.target[0])),
        "obj_xy": np.asarray(s.obj_xy[0]).tolist(),
        "pad_xy": np.asarray(s.pad_xy[0]).tolist(),
        "distractor_xy": np.asarray(s.distractor_xy[0]).tolist() if d >= 0 else None,
        "ee_init": np.asarray(s.ee_init[0]).tolist(),
        "move_step": int(s.move_step[0]),
        "move_xy": np.asarray(s.move_xy[0]).tolist(),
    }
