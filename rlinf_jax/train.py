"""`python -m rlinf_jax.train`: the command. Its code is `rlinf_jax.cli.train`; from Python,
``rlinf_jax.train(...)`` is the function `rlinf_jax.api.train`.

Only run, never imported (see `rlinf_jax.cli.run_command`).
"""

from rlinf_jax.cli import run_command

run_command(__name__)
