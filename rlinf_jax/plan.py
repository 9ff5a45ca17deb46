"""`python -m rlinf_jax.plan`: the command. Its code is `rlinf_jax.cli.plan`; from Python,
``rlinf_jax.plan(...)`` is the function `rlinf_jax.api.plan`.

Only run, never imported (see `rlinf_jax.cli.run_command`).
"""

from rlinf_jax.cli import run_command

run_command(__name__)
