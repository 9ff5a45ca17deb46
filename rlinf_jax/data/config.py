"""The ``data:`` section of a language-model recipe: where prompts come from, how they are
rendered and tokenised, and how many an RL iteration takes. The config schema uses this
class as the section itself, so there is one definition of every key."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_jax.data.math_tasks import check_levels
from rlinf_jax.data.templates import template_text
from rlinf_jax.data.tool_tasks import check_tool_levels
from rlinf_jax.errors import BadInput

SOURCES = ("procedural", "files", "reasoning_gym", "tool_calc", "tool_search")


@dataclass
class DataConfig:
    # Where prompts come from: the built-in generator, local files, or reasoning-gym.
    source: str = "procedural"
    # source=files: JSON Lines / JSON / Parquet; keys may be dotted (reward_model.ground_truth).
    train_path: str = ""
    eval_path: str = ""
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    # source=procedural: levels of rlinf_jax.data.math_tasks.LEVELS per split, and the share of
    # the problem space set aside for the held-out split.
    train_levels: list[int] = field(default_factory=lambda: [1])
    eval_levels: list[int] = field(default_factory=lambda: [1])
    heldout_fraction: float = 0.2
    # source=tool_calc / tool_search: SFT targets are tool-use transcripts (true) or the bare \boxed{answer}
    # (false: the no-tool control). Its levels are rlinf_jax.data.tool_tasks.TOOL_LEVELS.
    sft_tool_transcripts: bool = True
    # source=tool_calc: the share of train examples whose SFT target is a transcript (the rest
    # answer directly, so a warm start calls the tool on some prompts and guesses on others).
    sft_tool_fraction: float = 1.0
    # source=procedural, tool_calc, tool_search and reasoning_gym: dataset sizes.
    train_size: int = 10_000
    eval_size: int = 200
    reasoning_gym_task: str = ""
    # Prompt template: "plain", "math" (asks for a \boxed{} answer) or a text with {prompt}.
    template: str = "math"
    use_chat_template: bool = False
    system_prompt: str = ""
    # Seeds the generator and the loader's per-epoch shuffles.
    seed: int = 0
    shuffle: bool = True
    # "char" (the built-in character tokenizer) or a local model directory.
    tokenizer: str = "char"
    # Prompts per RL iteration (each sampled algorithm.lm.group_size times).
    rollout_batch_size: int = 32
    # Longer prompts are an error (no silent truncation of a question).
    max_prompt_length: int = 256

    def validate(self) -> DataConfig:
        if self.source not in SOURCES:
            raise BadInput(f"data.source={self.source!r} is unknown; use one of {', '.join(SOURCES)}")
        if self.source == "files" and not self.train_path:
            raise BadInput("data.source=files needs data.train_path (a .jsonl or .parquet file)")
        if self.source == "reasoning_gym" and not self.reasoning_gym_task:
            raise BadInput("data.source=reasoning_gym needs data.reasoning_gym_task (e.g. basic_arithmetic)")
        for name in ("prompt_key", "answer_key"):
            if not getattr(self, name):
                raise BadInput(f"data.{name} is empty; name the record's field")
        if self.source == "procedural":
            check_levels(self.train_levels)
            check_levels(self.eval_levels)
        if self.source == "tool_calc":
            check_tool_levels(self.train_levels)
            check_tool_levels(self.eval_levels)
        if not 0.0 <= self.sft_tool_fraction <= 1.0:
            raise BadInput(f"data.sft_tool_fraction={self.sft_tool_fraction} must lie between 0 and 1")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise BadInput(f"data.heldout_fraction={self.heldout_fraction} must lie strictly between 0 and 1")
        for name in ("train_size", "eval_size"):
            if getattr(self, name) <= 0:
                raise BadInput(f"data.{name}={getattr(self, name)} must be positive")
        for name in ("rollout_batch_size", "max_prompt_length"):
            if getattr(self, name) < 1:
                raise BadInput(f"data.{name}={getattr(self, name)} must be >= 1")
        if not self.tokenizer.strip():
            raise BadInput("data.tokenizer is empty; use char or a local model directory")
        template_text(self.template)
        return self
