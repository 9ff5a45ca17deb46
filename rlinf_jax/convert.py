"""`python -m rlinf_jax.convert`: the command. Its code is `rlinf_jax.cli.convert`; from Python,
``rlinf_jax.convert(...)`` is the function `rlinf_jax.api.convert`.

Only run, never imported (see `rlinf_jax.cli.run_command`).
"""

from rlinf_jax.cli import run_command

run_command(__name__)
