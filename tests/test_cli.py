"""The training CLI: every kind of bad input is one `error:` line and exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlinf_jax.cli.train import main
from rlinf_jax.runtime import read_metrics
from tests.conftest import run_cli


def _error_line(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error: "), err
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["runner.max_step=3"], "runner.max_steps"),  # typo -> closest key
        (["runner.bogus=1"], "runner.bogus"),  # unknown key
        (["runner.max_steps=abc"], "runner.max_steps"),  # wrong type
        (["runner.max_steps=0"], "runner.max_steps"),  # impossible value
        (["algorithm.gamma=1.5"], "algorithm.gamma"),
        (["--config-name", "no_such_recipe"], "ppo_brax"),  # unknown recipe lists recipes
        (["env.name=inverted_pendulm"], "inverted_pendulum"),  # unknown env lists envs
        (["env.backend=physx"], "positional"),
        (["runner.resume=/no/such/checkpoint"], "/no/such/checkpoint"),
        (["max_steps"], "max_steps"),  # malformed override
    ],
)
def test_bad_input_is_one_error_line(capsys, tmp_path, argv, expected):
    err = _error_line(capsys, [*argv, f"runner.output_dir={tmp_path}"])
    assert expected in err
    assert not any(tmp_path.iterdir()), "bad input must not create anything"


def test_unknown_env_lists_the_envs(capsys):
    err = _error_line(capsys, ["env.name=antt"])
    assert "ant" in err and "halfcheetah" in err and "did you mean" in err


def test_cli_process_exit_code_and_stderr(tmp_path):
    proc = run_cli(["runner.max_steps=-1", f"runner.output_dir={tmp_path}"])
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr


def test_list_recipes_and_envs(capsys):
    assert main(["--list-recipes"]) == 0
    out = capsys.readouterr().out.split()
    assert {"ppo_brax", "ppo_brax_ant", "ppo_brax_halfcheetah", "ppo_playground_cheetah"} <= set(out)
    assert main(["--list-envs"]) == 0
    out = capsys.readouterr().out
    assert "inverted_pendulum" in out and "CartpoleBalance" in out


@pytest.mark.slow
def test_evaluate_a_checkpoint(tmp_path, tiny, capsys):
    import json

    from rlinf_jax.cli.evaluate import main as evaluate_main

    assert main([*tiny, "runner.max_steps=2"]) == 0
    capsys.readouterr()
    run_dir = tmp_path / "t"
    # By default: the episodes of the run's own evaluation at the checkpoint's step, so the
    # numbers are the ones the run logged there.
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert evaluate_main([str(run_dir)]) == 0
    own = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert own["step"] == logged["step"] == 2 and own["protocol"] == "the run's own evaluation at step 2"
    for key in ("eval/return", "eval/return_std", "eval/episode_length"):
        assert own[key] == pytest.approx(logged[key], rel=1e-5), key
    # --seed draws other episodes, and says so.
    assert evaluate_main([str(run_dir), "--seed", "3", "env.num_eval_envs=8"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["step"] == 2 and first["episodes"] == 8 and first["checkpoint"].endswith("/2")
    assert first["seed"] == 3 and first["protocol"].startswith("seed 3: other episodes")
    assert 0 < first["eval/episode_length"] <= 200 and first["eval/return"] > 0
    # Reproducible: the same checkpoint and seed give the same numbers.
    assert evaluate_main([str(run_dir / "checkpoints" / "2"), "--seed", "3", "env.num_eval_envs=8"]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second == first

    # runner.eval_episodes=fixed: every evaluation plays the same episodes. A policy that
    # does not change (lr 1e-12, no observation statistics) then scores the same at every
    # evaluation, where the fresh protocol scores it on other episodes each time. Training
    # draws no key of the evaluation's, so the two runs hold the same parameters.
    frozen = [*tiny, "runner.max_steps=2", "runner.eval_interval=1", "actor.optim.lr=1e-12",
              "algorithm.normalize_observations=false"]
    evals = {}
    for mode in ("fresh", "fixed"):
        assert main([*frozen, f"runner.experiment_name={mode}", f"runner.eval_episodes={mode}"]) == 0
        evals[mode] = {r["step"]: r["eval/return"] for r in read_metrics(tmp_path / mode) if "eval/return" in r}
    capsys.readouterr()
    assert set(evals["fresh"]) == set(evals["fixed"]) == {1, 2}
    assert evals["fixed"][2] == pytest.approx(evals["fixed"][1], rel=1e-6)
    assert evals["fresh"][2] != pytest.approx(evals["fresh"][1], rel=1e-3)
    # The fixed run's checkpoint, scored by the fresh protocol, is the fresh run's step 2;
    # by its own, what the fixed run logged.
    for override, expected in (("runner.eval_episodes=fresh", evals["fresh"][2]), (None, evals["fixed"][2])):
        assert evaluate_main([str(tmp_path / "fixed"), *([override] if override else [])]) == 0
        scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert scored["eval/return"] == pytest.approx(expected, rel=1e-5), override
    assert main([*tiny, "runner.experiment_name=bad", "runner.eval_episodes=same"]) == 2
    assert "runner.eval_episodes='same' is not one of fresh, fixed" in capsys.readouterr().err


def test_evaluate_bad_path_is_one_error_line(tmp_path, capsys):
    from rlinf_jax.cli.evaluate import main as evaluate_main

    assert evaluate_main([str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "nothing" in err


@pytest.mark.parametrize(
    "module, argv, expected",
    [
        ("evaluate", ["/no/such/path"], "error: path='/no/such/path': no such path"),
        ("evaluate", ["--checkpoint", "/no/such/model"], "error: --checkpoint='/no/such/model': no such path"),
        ("evaluate", ["{empty}"], "holds no finished checkpoint"),
        ("train", ["--list-recipes"], "rlpd_brax"),
        ("train", ["--list-envs"], "brax: ant,"),
    ],
)
def test_what_only_reads_answers_before_jax_loads(tmp_path, module, argv, expected):
    """A bad path, the recipes and the envs: answered in a fraction of the seconds JAX, Brax
    and MJX take to import."""
    argv = [a.format(empty=tmp_path) for a in argv]
    code = (f"import sys; from rlinf_jax.cli.{module} import main; code = main({argv!r}); "
            "print('imported', [m for m in ('jax', 'brax', 'mujoco_playground') if m in sys.modules]); sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "imported []" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.returncode == (0 if module == "train" else 2)
    assert expected in proc.stdout + proc.stderr


def test_evaluate_takes_overrides_after_a_checkpoint():
    from rlinf_jax.cli.evaluate import _parse_args

    args = _parse_args(["--checkpoint", "run", "data.eval_size=3", "--seed", "2", "rollout.eval_batch_size=8"])
    assert args.path is None and args.overrides == ["data.eval_size=3", "rollout.eval_batch_size=8"]
    args = _parse_args(["runs/ppo", "env.num_eval_envs=8"])
    assert args.path == "runs/ppo" and args.overrides == ["env.num_eval_envs=8"]
