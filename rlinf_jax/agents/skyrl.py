"""SkyRL-gym environments as text environments (`rlinf_jax.agents.env.TextEnv`).

``pip install "rlinf-jax[skyrl]"`` adds ``skyrl-gym``; ``agent.env: skyrl`` with
``agent.skyrl_env: <registered id>`` (e.g. ``gsm8k_multi_turn``, or one the user registered
with ``skyrl_gym.register``) trains on it. SkyRL-gym speaks OpenAI-style message lists; this
flow speaks text, so:

- ``reset(row)`` builds the environment with SkyRL's ``extras`` from the row
  (``reward_spec.ground_truth`` from ``answer``, ``extra_info``, ``max_turns``), calls its
  ``init`` on the prompt as one user message and returns the contents of the messages it
  gives back, one per line;
- ``step(text)`` passes the model's text to the environment's ``step`` and returns its
  observation messages rendered the same way (each on a new line), its reward, ``done``
  and ``metadata`` as the info.

The episode's reward is the sum of its turns' rewards (the rollout's rule), so turn-level
shaping such as ``gsm8k_multi_turn``'s format score adds up as SkyRL's own loop adds it.
SkyRL's environments are created one per episode, as its generator does, and closed when
the episode ends or the slot is reset.
"""

from __future__ import annotations

from typing import Any

from rlinf_jax.agents.env import StepResult
from rlinf_jax.errors import BadInput

INSTALL_HINT = 'pip install "rlinf-jax[skyrl]" (or pip install skyrl-gym)'


def skyrl_gym():
    """The ``skyrl_gym`` module, or a one-line error naming the install command."""
    try:
        import skyrl_gym  # optional extra (skyrl): only where agent.env=skyrl
    except ImportError as e:
        raise BadInput(f"agent.env=skyrl needs skyrl-gym, which is not installed: {INSTALL_HINT}") from e
    return skyrl_gym


def check_env_id(env_id: str) -> None:
    """A one-line error for an id SkyRL-gym has not registered (before any episode starts)."""
    registry = skyrl_gym().registry
    if env_id not in registry:
        raise BadInput(f"agent.skyrl_env={env_id!r} is not a registered SkyRL-gym environment; choose one of "
                       f"{', '.join(sorted(registry))} or register yours with skyrl_gym.register")


def render(messages) -> str:
    """Message contents, each on a line of its own (the conversation is plain text here)."""
    return "".join("\n" + str(m.get("content", "")) for m in messages or [])


class SkyRLTextEnv:
    """One SkyRL-gym ``BaseTextEnv`` per episode behind the ``reset`` / ``step`` protocol."""

    def __init__(self, env_id: str, max_turns: int, env_config: dict | None = None):
        # max_turns: checked with the episode limits (`agents.config.TurnLimits`).
        self.env_id, self.max_turns, self.env_config = env_id, int(max_turns), dict(env_config or {})
        self.env = None

    def extras(self, row: dict) -> dict[str, Any]:
        """SkyRL's per-example ``extras`` for a data row: the row's own ``reward_spec`` and
        ``extra_info`` where it has them, else the answer as the rule-based ground truth."""
        spec = row.get("reward_spec") or {"method": "rule", "ground_truth": str(row.get("answer", ""))}
        return {"reward_spec": spec, "extra_info": dict(row.get("extra_info") or {}), "max_turns": self.max_turns}

    def reset(self, row: dict) -> str:
        if "prompt" not in row:
            raise BadInput("a SkyRL-gym environment row needs a 'prompt'")
        self.close()
        self.env = skyrl_gym().make(self.env_id, env_config=self.env_config, extras=self.extras(row))
        messages, _ = self.env.init([{"role": "user", "content": str(row["prompt"])}])
        return render(messages).removeprefix("\n")

    def step(self, model_text: str) -> StepResult:
        if self.env is None:
            raise RuntimeError("step before reset")
        out = self.env.step(model_text)
        done = bool(out["done"])
        result = StepResult("" if done else render(out.get("observations")), float(out["reward"]), done,
                            dict(out.get("metadata") or {}))
        if done:
            self.close()
        return result

    def close(self) -> None:
        if self.env is not None:
            env, self.env = self.env, None
            env.close()
