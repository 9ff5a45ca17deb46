"""Reasoning data: prompt/answer datasets, the procedural math generator, prompt templates
and the character tokenizer of the offline tiny model. No JAX here: data stays on the host."""

from rlinf_jax.data.char_tokenizer import CharTokenizer
from rlinf_jax.data.config import DataConfig
from rlinf_jax.data.datasets import (
    PromptBatch,
    PromptDataset,
    PromptLoader,
    ReasoningGymDataset,
    build_datasets,
    eval_batches,
    load_prompt_dataset,
)
from rlinf_jax.data.math_tasks import LEVELS, MathTaskGenerator, ProceduralMathDataset
from rlinf_jax.data.templates import MATH_INSTRUCTION, TEMPLATES, PromptTemplate, boxed_response
from rlinf_jax.data.hf_tokenizer import load_tokenizer
from rlinf_jax.data.tokenizers import get_tokenizer, run_tokenizer

__all__ = [
    "LEVELS",
    "MATH_INSTRUCTION",
    "TEMPLATES",
    "CharTokenizer",
    "DataConfig",
    "MathTaskGenerator",
    "ProceduralMathDataset",
    "PromptBatch",
    "PromptDataset",
    "PromptLoader",
    "PromptTemplate",
    "ReasoningGymDataset",
    "boxed_response",
    "build_datasets",
    "eval_batches",
    "get_tokenizer",
    "load_tokenizer",
    "load_prompt_dataset",
    "run_tokenizer",
]
