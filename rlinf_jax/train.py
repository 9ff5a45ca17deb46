"""`python -m rlinf_jax.train`: the command. Its code is `rlinf_jax.cli.train`; from Python,
``rlinf_jax.train(...)`` is the function `rlinf_jax.api.train`.

Only run, never imported: importing a submodule makes Python set it as the package's
attribute, which would turn ``rlinf_jax.train`` from the function into this module.
"""

if __name__ != "__main__":
    raise ImportError(
        "rlinf_jax.train is the command `python -m rlinf_jax.train`, not a module to import: call "
        "rlinf_jax.train(...) (the function), or import rlinf_jax.cli.train for its main()"
    )

import sys

from rlinf_jax.cli.train import main

sys.exit(main())
