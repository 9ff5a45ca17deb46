"""Reasoning RL of a language model on verifiable rewards (``runner.task=reasoning``):
GRPO, DAPO, REINFORCE++ and PPO, with an SFT warm start."""
