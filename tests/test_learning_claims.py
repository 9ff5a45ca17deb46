"""The learning claims of the docs, each asserted at a reduced scale against the control
its doc names. The full-scale figures come from the benchmark beside each claim:

- off-policy sample efficiency (docs/offpolicy.md): CrossQ against SAC on the same env
  steps and gradient steps (`benchmarks/offpolicy_sample_efficiency.py`);
- reasoning (docs/reasoning.md): GRPO after a warm start against spending its compute on
  more SFT instead (`benchmarks/rl_vs_sft.py`). The control here gets less compute than
  the GRPO run spent, never more, so where it wins, the benchmark's compute-matched
  control wins by at least as much. GRPO's own gain over its warm start is not asserted:
  at a size a test affords, its sign changes with the seed (the test says by how much);
- the calculator agent (docs/agentic.md): GRPO makes a warm start that mostly answers
  directly call the tool, and the same warm start continued by SFT for longer than the
  GRPO iterations take does not.
- the VLA on the tabletop (docs/vla.md): PPO raises the recipe's behaviour-cloned
  start, scored on the same episodes before and after. The docs' control (the clone
  continued for the recipe's wall time) swings with the seed, so the docs claim, and this
  test asserts, the gain over the clone only.

Tests that train long enough for XLA's optimisation to pay for itself are `optimized`
(tests/conftest.py): compiled as users compile, in a child process."""

from __future__ import annotations

import json
import shutil

import pytest

from rlinf_jax.runtime import read_metrics
from rlinf_jax.cli.evaluate import main as evaluate
from rlinf_jax.cli.train import main

QUIET = ["runner.progress_bar=false", "runner.tensorboard=false", "runner.save_interval=0"]


def evals(run_dir, key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in read_metrics(run_dir) if key in r}


# ------------------------------------------------------------------ off-policy

# The sample-efficiency benchmark's schedule: 64 envs x 10 steps and 320 gradient steps of
# 64 transitions per iteration, for every algorithm.
SCHEDULE = [
    "algorithm.rollout_length=10", "algorithm.offpolicy.utd_ratio=32", "algorithm.offpolicy.batch_size=64",
    "algorithm.offpolicy.replay_size=16384", "algorithm.offpolicy.learning_starts=512", "algorithm.gamma=0.97",
    "algorithm.reward_scale=10.0", "algorithm.normalize_observations=true", "env.num_envs=64",
]


@pytest.mark.slow
@pytest.mark.optimized
def test_crossq_reaches_the_threshold_in_a_fraction_of_sacs_env_steps(tmp_path):
    # docs/offpolicy.md: CrossQ reaches 900 on inverted_pendulum at its first evaluation
    # (3,200 env steps) in every seed; SAC on the same schedule needs 9,600 or more. Here
    # two seeds side by side, CrossQ's critics 256 wide (the benchmark's 512, the paper's
    # 2048), both scored at 3,200 env steps on 16 evaluation episodes.
    common = [*QUIET, *SCHEDULE, "runner.seeds=[0,1]", "runner.max_steps=5", "runner.eval_interval=5",
              "env.num_eval_envs=16", f"runner.output_dir={tmp_path}"]
    assert main(["--config-name", "sac_brax", *common, "runner.experiment_name=sac"]) == 0
    assert main(["--config-name", "crossq_brax", *common, "runner.experiment_name=crossq",
                 "actor.model.value_hidden_sizes=[256,256]"]) == 0
    for seed in (0, 1):
        key = f"eval/return@seed{seed}"
        sac, crossq = evals(tmp_path / "sac", key)[5], evals(tmp_path / "crossq", key)[5]
        assert crossq >= 900 and crossq > sac + 300, (seed, crossq, sac)


# ------------------------------------------------------------------ reasoning

# The tests' tiny LM (tests/test_reasoning_flow.py) on single-digit sums.
TINY_LM = [
    "actor.model.lm.hidden_size=64", "actor.model.lm.intermediate_size=128", "actor.model.lm.num_layers=2",
    "actor.model.lm.num_heads=2", "actor.model.lm.num_kv_heads=1", "data.train_levels=[1]", "data.eval_levels=[1]",
    "data.eval_size=64", "rollout.max_new_tokens=12", "rollout.eval_batch_size=64",
]


@pytest.mark.slow
def test_grpo_math_from_a_short_warm_start_is_beaten_by_more_sft_for_less_compute(tmp_path):
    # docs/reasoning.md: GRPO raises held-out accuracy over its warm start (+17.9 points
    # over two seeds at the recipe's scale), and the same compute spent on SFT raises it
    # further. Here the control continues the warm start by one SFT step (64 sequences, one
    # optimiser step) per GRPO iteration (32 samples generated, scored, then four optimiser
    # steps of 16): less than an iteration's compute, and it still ends far above GRPO.
    # GRPO's own gain does not hold at this size: from 60 warm-start steps, 30 iterations
    # moved seed 0 from 10.9% to 18.8% with LLVM's optimisation off and to 9.4% with it on,
    # and 60 iterations at half the learning rate (128 problems) gave +6.2, +7.8 and -7.8
    # points for seeds 0, 1 and 2, while the control ended 19.6-48.4 points above GRPO in
    # every one of those runs. So this test asserts the control's lead, not GRPO's gain.
    steps, iterations = 60, 30
    common = [*QUIET, *TINY_LM, "sft.lr=3e-3", "data.rollout_batch_size=8", "algorithm.lm.group_size=4",
              "actor.global_batch_size=16", "actor.micro_batch_size=16", "algorithm.update_epochs=2",
              "actor.optim.lr=1e-3", f"runner.output_dir={tmp_path}"]
    assert main(["--config-name", "grpo_math", *common, "runner.experiment_name=rl", f"sft.warm_start_steps={steps}",
                 f"runner.max_steps={iterations}", f"runner.eval_interval={iterations}"]) == 0
    assert main(["--config-name", "grpo_math", *common, "runner.experiment_name=sft",
                 f"sft.warm_start_steps={steps + iterations}", "runner.max_steps=1"]) == 0
    rl = evals(tmp_path / "rl", "eval/accuracy")
    control = evals(tmp_path / "sft", "eval/accuracy")[0]
    assert control > max(rl.values()) + 0.1, (control, rl)


# ------------------------------------------------------------------ agentic


@pytest.mark.slow
@pytest.mark.optimized
def test_grpo_makes_the_agent_rely_on_the_calculator_where_more_sft_does_not(tmp_path):
    # docs/agentic.md: GRPO from the recipe's warm start (30% of the SFT examples call the
    # calculator, the rest answer directly) makes every greedy held-out episode call the
    # tool, while the same warm start continued by SFT for longer keeps guessing (0 calls,
    # 0% right). Here the recipe's model from a 400-step warm start, 10 GRPO iterations,
    # and as the control the same warm start continued by 60 SFT steps (about 16 s of
    # steps against the iterations' 9-10 s). What varies with the seed and with the CPU's
    # rounding is whether a warm start this short copies the operands into its calls at
    # all (docs say how often): seed 1 does on the Intel Xeon and on one AMD EPYC (where
    # seed 0 calls the tool but copies poorly: 18.8%), seed 0 on another AMD EPYC (AVX2),
    # where seeds 1 and 2 never earn a reward. So the test tries seed 0, then seed 1, stops
    # at the first whose GRPO run calls the tool and answers 30% right, and asserts what
    # GRPO and SFT make of that seed's warm start.
    warm, iterations, more = 400, 10, 60
    tried = {}
    for seed in (0, 1):
        out = tmp_path / f"seed{seed}"
        common = [*QUIET, f"runner.seed={seed}", f"runner.output_dir={out}"]
        assert main(["--config-name", "grpo_tool_calc", *common, "runner.experiment_name=rl",
                     f"sft.warm_start_steps={warm}", f"runner.max_steps={iterations}",
                     f"runner.eval_interval={iterations}"]) == 0
        calls, accuracy = evals(out / "rl", "eval/agent/tool_calls"), evals(out / "rl", "eval/accuracy")
        tried[seed] = (calls, accuracy)
        if calls[iterations] >= 0.9 and accuracy[iterations] >= 0.3:
            break
    assert calls[iterations] >= 0.9 and accuracy[iterations] >= 0.3, tried
    # The control extends the RL run's own warm start (a copy): the SFT run resumed from
    # its last step, as a longer warm start would have gone on (constant learning rate).
    shutil.copytree(out / "rl" / "sft", out / "control")
    assert main(["--config-name", str(out / "control" / "config.yaml"), f"runner.output_dir={out}",
                 "runner.experiment_name=control", f"runner.max_steps={warm + more}"]) == 0
    report = out / "control.json"
    assert evaluate(["--checkpoint", str(out / "control"), "--out", str(report), "--no-progress"]) == 0
    control = json.loads(report.read_text())
    assert control["step"] == warm + more
    assert calls[0] == 0.0 and control["agent/tool_calls"] == 0.0, (calls, control)
    assert accuracy[iterations] >= control["accuracy"] + 0.3, (accuracy, control["accuracy"])


# ------------------------------------------------------------------ VLA


@pytest.mark.slow
@pytest.mark.optimized
def test_ppo_raises_the_vla_clones_success_on_the_same_episodes(tmp_path):
    # docs/vla.md: PPO from the recipe's clone (1,200 cloning steps on 512 demonstrations,
    # not a start cut short) raises train-split success in both seeds measured. Here 80
    # iterations of 32 envs (the recipe: 250 of 64) after a 500-step critic warm-up, both
    # evaluations on the same 1,024 episodes (`runner.eval_episodes=fixed`), where one
    # evaluation's standard error is about 1.5 points. Measured on the AMD EPYC: 30.5 ->
    # 37.2% (seed 0); a gain of 3 points is about 1.4 standard errors of the difference of
    # two independent evaluations, and these two share their episodes.
    iterations = 80
    assert main(["--config-name", "ppo_vla_tabletop", *QUIET, "runner.seed=0", "env.num_envs=32",
                 "sft.critic_warmup_steps=500", f"runner.max_steps={iterations}", f"runner.eval_interval={iterations}",
                 "runner.eval_episodes=fixed", "env.num_eval_envs=1024", f"runner.output_dir={tmp_path}",
                 "runner.experiment_name=rl"]) == 0
    success = evals(tmp_path / "rl", "eval/success/train")
    assert success[iterations] >= success[0] + 0.03, success
