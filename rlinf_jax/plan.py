"""`python -m rlinf_jax.plan`: the command. Its code is `rlinf_jax.cli.plan`; from Python,
``rlinf_jax.plan(...)`` is the function `rlinf_jax.api.plan`.

Only run, never imported: importing a submodule makes Python set it as the package's
attribute, which would turn ``rlinf_jax.plan`` from the function into this module.
"""

if __name__ != "__main__":
    raise ImportError(
        "rlinf_jax.plan is the command `python -m rlinf_jax.plan`, not a module to import: call "
        "rlinf_jax.plan(...) (the function), or import rlinf_jax.cli.plan for its main()"
    )

import sys

from rlinf_jax.cli.plan import main

sys.exit(main())
