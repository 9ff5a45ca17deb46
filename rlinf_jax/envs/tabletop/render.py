"""RGB images in JAX: `mjx.ray` from a fixed pinhole camera, colours painted per geom id.

One ray per pixel finds the nearest geom (`mjx.ray` returns its distance and id). The
colour then comes from the episode, not the model: objects and pads take their catalogue
colours, the table a procedural texture evaluated at the hit point, the floor and the wall
(rays that hit nothing) the episode's background. That is what lets one compiled model show
every episode, and the vision split change textures without touching physics.

Shading is flat: a colour per surface, no lights. At 32-64 px the policy needs shapes and
colours, and a flat image keeps the pixel a test projects by hand exactly the object's
colour. Images are uint8 [H, W, 3].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from mujoco import mjx

from rlinf_jax.envs.tabletop import catalog, scene
from rlinf_jax.envs.tabletop.episodes import EpisodeSpec


def texture(pattern: jax.Array, a: jax.Array, b: jax.Array, period: jax.Array, xy: jax.Array) -> jax.Array:
    """Colour [..., 3] of a table texture at table points xy [..., 2]."""
    cx, cy = jnp.floor(xy[..., 0] / period), jnp.floor(xy[..., 1] / period)
    fx, fy = xy[..., 0] / period - cx, xy[..., 1] / period - cy
    parity = jnp.stack(
        [
            jnp.zeros_like(cx),  # plain
            jnp.mod(cx + cy, 2),  # checker
            jnp.mod(cx, 2),  # stripes_x: bands across x
            jnp.mod(cy, 2),  # stripes_y
            jnp.mod(jnp.floor((xy[..., 0] + xy[..., 1]) / period), 2),  # diagonal
            ((fx < 0.12) | (fy < 0.12)).astype(cx.dtype),  # grid lines
        ]
    )[pattern]
    return jnp.where(parity[..., None] > 0.5, b, a)


def geom_ids(m: mjx.Model, d: mjx.Data, rays: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(distance, geom id) [H, W] of each camera ray; -1 where it hits nothing."""
    origin = jnp.asarray(scene.CAMERA_POS)
    flat = rays.reshape(-1, 3)
    dist, gid = jax.vmap(lambda v: mjx.ray(m, d, origin, v))(flat)
    return dist.reshape(rays.shape[:-1]), gid.reshape(rays.shape[:-1])


def palette(spec: EpisodeSpec, grip: jax.Array) -> jax.Array:
    """Flat colour [Geom.COUNT, 3] of each geom (the table's is replaced by its texture)."""
    slot = jnp.asarray(catalog.OBJECT_SLOT)
    rgb = jnp.asarray(catalog.OBJECT_RGB)
    objects = jnp.zeros((scene.NUM_SLOTS, 3)).at[slot[spec.obj]].set(rgb[spec.obj])
    has_distractor = spec.distractor >= 0
    d = jnp.maximum(spec.distractor, 0)
    objects = jnp.where(has_distractor, objects.at[slot[d]].set(rgb[d]), objects)
    pads = jnp.asarray(catalog.PAD_RGB)[jnp.stack([spec.target, spec.other_pad])]
    ee = jnp.where(grip > 0.5, jnp.asarray(catalog.EE_CLOSED_RGB), jnp.asarray(catalog.EE_OPEN_RGB))
    floor = jnp.asarray(catalog.FLOOR_RGB)[spec.background]
    table = jnp.asarray(catalog.TEXTURE_A)[spec.texture]
    return jnp.concatenate([floor[None], table[None], pads, objects, ee[None]], axis=0)


def shade(dist: jax.Array, gid: jax.Array, rays: jax.Array, spec: EpisodeSpec, grip: jax.Array) -> jax.Array:
    """uint8 [H, W, 3] image from per-pixel hits."""
    colours = palette(spec, grip)
    flat = colours[jnp.clip(gid, 0, scene.Geom.COUNT - 1)]
    hit = jnp.asarray(scene.CAMERA_POS) + dist[..., None] * rays
    t = spec.texture
    table = texture(
        jnp.asarray(catalog.TEXTURE_PATTERN)[t],
        jnp.asarray(catalog.TEXTURE_A)[t],
        jnp.asarray(catalog.TEXTURE_B)[t],
        jnp.asarray(catalog.TEXTURE_PERIOD)[t],
        hit[..., :2],
    )
    wall = jnp.asarray(catalog.WALL_RGB)[spec.background]
    rgb = jnp.where((gid == scene.Geom.TABLE)[..., None], table, flat)
    rgb = jnp.where((gid < 0)[..., None], wall, rgb)
    return jnp.round(jnp.clip(rgb, 0.0, 1.0) * 255).astype(jnp.uint8)


def render(m: mjx.Model, d: mjx.Data, rays: jax.Array, spec: EpisodeSpec, grip: jax.Array) -> jax.Array:
    """One env's camera image, uint8 [H, W, 3]; `d` needs geom poses (after kinematics)."""
    dist, gid = geom_ids(m, d, rays)
    return shade(dist, gid, rays, spec, grip)
