"""Embodied RL (``runner.task=embodied``): PPO and group advantages on batched JAX envs, with
an MLP, VLA or pi0 policy, fused or staged on any placement."""
