"""Prompt templates: how a dataset's prompt becomes the text the policy continues.

Two layers, as in TRL and RLinf. The *text* template places the prompt in an instruction
(``"{prompt}"`` as is, or the math instruction that asks for a ``\\boxed{}`` answer, which the
reward looks for). The *chat* layer, when asked for or when the prompt is already a list of chat
messages, wraps the user turn with the tokenizer's own ``apply_chat_template`` so an instruct
or R1-distilled checkpoint sees the turn markers it was trained with.
"""

from __future__ import annotations

from rlinf_jax.errors import BadInput

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TEMPLATES = {
    "plain": "{prompt}",
    "math": "{prompt}\n" + MATH_INSTRUCTION,
}


def template_text(template: str) -> str:
    """The text of a named template, or ``template`` itself when it holds ``{prompt}``."""
    if template in TEMPLATES:
        return TEMPLATES[template]
    if "{prompt}" not in template:
        raise BadInput(
            f"prompt template {template!r} is neither a name ({', '.join(TEMPLATES)}) nor a text "
            "containing {prompt}; set data.template to one of those"
        )
    return template


def _check_messages(messages):
    ok = isinstance(messages, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    )
    if not ok or not messages:
        raise BadInput('a chat prompt must be a non-empty list of {"role": str, "content": str} messages')


class PromptTemplate:
    """``render(prompt) -> str`` for a string prompt or a list of chat messages.

    ``template``: a name in ``TEMPLATES`` or a text with ``{prompt}`` (filled by plain
    replacement, so the braces of ``\\boxed{}`` need no escaping). ``use_chat_template``: wrap
    the user turn (and ``system_prompt``) with ``tokenizer.apply_chat_template`` and the
    generation prompt. Message-list prompts always go through the chat template, unchanged.
    """

    def __init__(self, template: str = "math", use_chat_template: bool = False, system_prompt: str = "", tokenizer=None):
        self.text = template_text(template)
        self.use_chat_template = bool(use_chat_template)
        self.system_prompt = system_prompt or ""
        self.tokenizer = tokenizer
        if self.use_chat_template:
            self._require_chat()

    def _require_chat(self):
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise BadInput(
                "a chat template needs a tokenizer that has one (a model directory whose "
                "tokenizer_config.json holds chat_template); set data.use_chat_template=false "
                "or use such a checkpoint"
            )

    def fill(self, prompt: str) -> str:
        """The text template around ``prompt``, without any chat wrapping."""
        return self.text.replace("{prompt}", prompt)

    def messages(self, prompt) -> list[dict]:
        """The chat messages for ``prompt`` (system prompt first when given and absent)."""
        if isinstance(prompt, str):
            msgs = [{"role": "user", "content": self.fill(prompt)}]
        else:
            _check_messages(prompt)
            msgs = list(prompt)
        if self.system_prompt and msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": self.system_prompt}, *msgs]
        return msgs

    def render(self, prompt) -> str:
        """The prompt text. A chat-rendered text already holds the model's start and turn
        tokens: tokenize it with ``add_special_tokens=False``."""
        if isinstance(prompt, str) and not self.use_chat_template:
            return self.fill(prompt)
        self._require_chat()
        return self.tokenizer.apply_chat_template(self.messages(prompt), tokenize=False, add_generation_prompt=True)

    def render_batch(self, prompts) -> list[str]:
        return [self.render(p) for p in prompts]


def boxed_response(answer: str) -> str:
    """The shortest response the math reward accepts for ``answer`` (an SFT target)."""
    return f"\\boxed{{{answer}}}"
