"""`python -m rlinf_jax.evaluate`: the command. Its code is `rlinf_jax.cli.evaluate`; from Python,
``rlinf_jax.evaluate(...)`` is the function `rlinf_jax.api.evaluate`.

Only run, never imported: importing a submodule makes Python set it as the package's
attribute, which would turn ``rlinf_jax.evaluate`` from the function into this module.
"""

if __name__ != "__main__":
    raise ImportError(
        "rlinf_jax.evaluate is the command `python -m rlinf_jax.evaluate`, not a module to import: call "
        "rlinf_jax.evaluate(...) (the function), or import rlinf_jax.cli.evaluate for its main()"
    )

import sys

from rlinf_jax.cli.evaluate import main

sys.exit(main())
