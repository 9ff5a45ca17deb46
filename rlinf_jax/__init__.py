"""rlinf-jax: JAX-first reinforcement learning on device meshes."""

__version__ = "0.1.0"
