"""Supervised fine-tuning (``runner.task=sft``): a language model on prompt -> answer
targets, or a VLA cloning the tabletop's scripted expert."""
