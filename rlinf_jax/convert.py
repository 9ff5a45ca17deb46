"""`python -m rlinf_jax.convert`: the command. Its code is `rlinf_jax.cli.convert`; from Python,
``rlinf_jax.convert(...)`` is the function `rlinf_jax.api.convert`.

Only run, never imported: importing a submodule makes Python set it as the package's
attribute, which would turn ``rlinf_jax.convert`` from the function into this module.
"""

if __name__ != "__main__":
    raise ImportError(
        "rlinf_jax.convert is the command `python -m rlinf_jax.convert`, not a module to import: call "
        "rlinf_jax.convert(...) (the function), or import rlinf_jax.cli.convert for its main()"
    )

import sys

from rlinf_jax.cli.convert import main

sys.exit(main())
