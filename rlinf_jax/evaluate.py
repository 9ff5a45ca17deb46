"""`python -m rlinf_jax.evaluate`: the command. Its code is `rlinf_jax.cli.evaluate`; from Python,
``rlinf_jax.evaluate(...)`` is the function `rlinf_jax.api.evaluate`.

Only run, never imported (see `rlinf_jax.cli.run_command`).
"""

from rlinf_jax.cli import run_command

run_command(__name__)
