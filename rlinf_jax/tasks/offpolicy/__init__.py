"""The off-policy family (``runner.task=offpolicy``): SAC, CrossQ, RLPD and IQL on batched
JAX envs, with a replay buffer inside the jitted loop, demonstrations and offline data."""
