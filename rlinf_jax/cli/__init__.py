"""The command-line programs' code: `train`, `evaluate`, `convert` and `plan`, each a ``main(argv)``
that parses its arguments, runs and returns an exit code (0 done, 1 the run failed or did not
fit, 2 bad input). ``python -m rlinf_jax.<name>`` runs them; these modules keep the names
free in the package, where ``rlinf_jax.train`` and the others are the API's functions.
"""
