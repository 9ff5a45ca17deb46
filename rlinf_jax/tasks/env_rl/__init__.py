"""The floor of the workloads that step environments (``runner.task=embodied``, the PPO of
control and VLA policies; ``runner.task=offpolicy``, SAC / CrossQ / RLPD / IQL): what they
share, so that neither task imports the other.

- `keys`: the config keys every env-stepping run reads;
- `summary`: what a finished run reports;
- `loop`: the host loop of an env-stepping run and its `run` skeleton.
"""
