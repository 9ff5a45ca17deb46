"""What an episode can be made of: objects, pads, table textures, backgrounds, templates.

Each list is split into what training episodes draw from and what only a test split
draws from (ManiSkill-style out-of-distribution evaluation):

- vision: unseen table textures and backgrounds; everything else as in training;
- semantic: unseen objects (a shape never trained on, colours never trained on) and unseen
  instruction paraphrases, with a distractor object on the table;
- execution: positions outside the training region, a perturbed initial pose and the object
  moved while the arm approaches it.

All colours are linear RGB in [0, 1].
"""

from __future__ import annotations

import numpy as np

from rlinf_jax.envs.tabletop.scene import SHAPES

COLOURS = {
    "red": (0.85, 0.12, 0.1),
    "green": (0.12, 0.68, 0.18),
    "blue": (0.12, 0.28, 0.9),
    "yellow": (0.95, 0.85, 0.08),
    "purple": (0.58, 0.18, 0.75),
    "orange": (1.0, 0.5, 0.05),
}
TRAIN_OBJECT_COLOURS = ("red", "green", "blue", "yellow")
TRAIN_OBJECT_SHAPES = ("cube", "ball", "capsule")


def _objects() -> tuple[list[tuple[str, str]], int]:
    """(colour, shape) pairs, the training ones first; returns them and how many train."""
    train = [(c, s) for s in TRAIN_OBJECT_SHAPES for c in TRAIN_OBJECT_COLOURS]
    unseen = [(c, s) for s in SHAPES for c in COLOURS if (c, s) not in train]
    return train + unseen, len(train)


OBJECTS, NUM_TRAIN_OBJECTS = _objects()
OBJECT_NAMES = tuple(f"{c} {s}" for c, s in OBJECTS)
OBJECT_SLOT = np.array([SHAPES.index(s) for _, s in OBJECTS], np.int32)
OBJECT_RGB = np.array([COLOURS[c] for c, _ in OBJECTS], np.float32)

# Target pads, named by colour; the same four in every split.
PADS = {
    "white": (0.95, 0.95, 0.93),
    "black": (0.06, 0.06, 0.07),
    "pink": (1.0, 0.5, 0.72),
    "cyan": (0.1, 0.85, 0.88),
}
PAD_NAMES = tuple(f"{c} pad" for c in PADS)
PAD_RGB = np.array(list(PADS.values()), np.float32)

# Table textures: (pattern, colour a, colour b, period in metres). Patterns are evaluated
# at the point a ray hits the table (see `render.texture`).
PATTERNS = ("plain", "checker", "stripes_x", "stripes_y", "diagonal", "grid")
TEXTURES = (
    # training
    ("plain", (0.55, 0.4, 0.26), (0.55, 0.4, 0.26), 0.1),  # wood
    ("checker", (0.62, 0.62, 0.6), (0.5, 0.5, 0.48), 0.08),  # grey tiles
    ("stripes_y", (0.8, 0.72, 0.55), (0.7, 0.62, 0.45), 0.05),  # beige planks
    ("checker", (0.45, 0.33, 0.22), (0.38, 0.27, 0.18), 0.12),  # dark wood tiles
    # vision split only
    ("plain", (0.1, 0.3, 0.15), (0.1, 0.3, 0.15), 0.1),  # green cloth
    ("diagonal", (0.12, 0.14, 0.38), (0.22, 0.24, 0.48), 0.06),  # navy diagonal
    ("grid", (0.85, 0.85, 0.8), (0.45, 0.45, 0.5), 0.07),  # marble with lines
    ("stripes_x", (0.45, 0.16, 0.1), (0.58, 0.28, 0.16), 0.04),  # red-brown stripes
)
NUM_TRAIN_TEXTURES = 4
TEXTURE_PATTERN = np.array([PATTERNS.index(t[0]) for t in TEXTURES], np.int32)
TEXTURE_A = np.array([t[1] for t in TEXTURES], np.float32)
TEXTURE_B = np.array([t[2] for t in TEXTURES], np.float32)
TEXTURE_PERIOD = np.array([t[3] for t in TEXTURES], np.float32)

# Backgrounds: (floor colour, wall colour seen where a ray hits nothing).
BACKGROUNDS = (
    # training
    ((0.35, 0.35, 0.37), (0.78, 0.8, 0.84)),
    ((0.3, 0.27, 0.25), (0.86, 0.84, 0.78)),
    ((0.25, 0.28, 0.3), (0.7, 0.76, 0.8)),
    # vision split only
    ((0.55, 0.1, 0.12), (0.2, 0.2, 0.25)),
    ((0.1, 0.35, 0.4), (0.95, 0.9, 0.55)),
    ((0.2, 0.4, 0.15), (0.55, 0.4, 0.7)),
)
NUM_TRAIN_BACKGROUNDS = 3
FLOOR_RGB = np.array([b[0] for b in BACKGROUNDS], np.float32)
WALL_RGB = np.array([b[1] for b in BACKGROUNDS], np.float32)

# The gripper's colour says whether it is closed.
EE_OPEN_RGB = np.array((0.82, 0.82, 0.88), np.float32)
EE_CLOSED_RGB = np.array((0.16, 0.16, 0.2), np.float32)

TEMPLATES = (
    # training
    "put the {object} on the {target}",
    "place the {object} on the {target}",
    "move the {object} onto the {target}",
    "pick up the {object} and put it on the {target}",
    # semantic split only
    "set the {object} down on top of the {target}",
    "grab the {object} and drop it onto the {target}",
    "the {object} goes on the {target}",
)
NUM_TRAIN_TEMPLATES = 4


def instruction_text(template: int, obj: int, target: int) -> str:
    return TEMPLATES[template].format(object=OBJECT_NAMES[obj], target=PAD_NAMES[target])
