"""Matrix-product kernels the models can route their products through
(``actor.model.matmul``): XLA's own, or Intel MKL's through an XLA custom call."""

from rlinf_jax.kernels.products import BACKENDS, add_bias, check_backend, check_name, matmul

__all__ = ["BACKENDS", "add_bias", "check_backend", "check_name", "matmul"]
