"""Workloads: one package per ``runner.task``, each reading top to bottom as one story (its
setup, its jitted step functions, its run). ``registry`` is the table the CLIs look up."""
