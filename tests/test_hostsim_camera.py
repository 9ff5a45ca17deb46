"""robosuite with the agentview camera (env.camera): uint8 images beside the state vector
through the workers' shared block, as a tabletop-shaped observation for a VLA. Skipped
without robosuite's worker environment (`python -m rlinf_jax.envs.install robosuite`)."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf_jax.envs.host import HostEnvPool, HostEnvSpec, describe
from rlinf_jax.errors import BadInput

pytest.importorskip("gymnasium")


def _python() -> str:
    from rlinf_jax.envs.install import recorded_python

    try:
        return recorded_python("robosuite")
    except BadInput as e:
        pytest.skip(str(e))


def _spec(python, camera="agentview", size=32, episode_length=3):
    return describe(HostEnvSpec("robosuite:Lift", episode_length=episode_length, python=python, reset_mode="cached",
                                camera=camera, image_size=size if camera else 0))


def _run(spec, actions, num_workers):
    """Images, states and flags of every step of ``actions`` [T, B, act] (copies)."""
    pool = HostEnvPool(spec, num_envs=actions.shape[1], num_workers=num_workers, seed=7)
    try:
        a = pool.arrays
        out = {"image0": a["image"].copy() if spec.image_shape else None, "obs0": a["obs"].copy(), "image": [],
               "final_image": [], "obs": [], "done": []}
        for step in actions:
            pool.step(step)
            for k in ("obs", "done") + (("image", "final_image") if spec.image_shape else ()):
                out[k].append(a[k].copy())
        return out
    finally:
        pool.close()


def test_camera_images_travel_beside_the_state_vector():
    python = _python()
    spec = _spec(python)
    assert (spec.observation_size, spec.action_size, spec.image_shape) == (60, 7, (32, 32, 3))
    actions = np.random.default_rng(0).uniform(-1, 1, (4, 2, 7)).astype(np.float32)
    one = _run(spec, actions, num_workers=1)
    assert one["image0"].dtype == np.uint8 and one["image0"].shape == (2, 32, 32, 3)
    assert one["image0"].std() > 10  # a rendered scene, not a blank buffer
    # Envs seeded alike render alike, however the batch is cut into workers.
    two = _run(spec, actions, num_workers=2)
    for k in ("image", "final_image", "obs"):
        np.testing.assert_array_equal(np.asarray(one[k]), np.asarray(two[k]))
    np.testing.assert_array_equal(one["image0"], two["image0"])
    # Two envs, two cube positions (per-env seeds): different first images.
    assert not np.array_equal(one["image0"][0], one["image0"][1])
    # The arm moves: the image changes with the steps.
    assert np.abs(one["image"][1].astype(int) - one["image0"].astype(int)).mean() > 0.5
    # At the 3-step limit the final image is the end of the episode and the current one
    # the next episode's start: with cached resets, the first image again.
    np.testing.assert_array_equal(one["done"][2], 1)
    np.testing.assert_array_equal(one["image"][2], one["image0"])
    assert not np.array_equal(one["final_image"][2], one["image0"])
    np.testing.assert_array_equal(one["final_image"][1], one["image"][1])  # no end: final = current
    # The camera run's state vector is the state-only run's observation, step for step.
    state = _run(_spec(python, camera=""), actions, num_workers=1)
    np.testing.assert_allclose(np.asarray(one["obs"]), np.asarray(state["obs"]), atol=1e-6)
    np.testing.assert_allclose(one["obs0"], state["obs0"], atol=1e-6)


def test_bad_camera_settings_are_one_error_line(capsys):
    from rlinf_jax.cli.train import main

    base = ["--config-name", "ppo_vla_robosuite_lift", "runner.progress_bar=false"]
    for override, words in (
        (["env.image_size=0"], "env.image_size"),
        (["env.camera=agent view"], "env.camera"),
        (["env.name=InvertedPendulum-v5"], "needs a robosuite or LIBERO env"),
        (["actor.model.kind=mlp", "algorithm.normalize_observations=true"], "actor.model.kind=vla"),
    ):
        assert main([*base, *override]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and words in err, err
    _python()
    # A camera robosuite does not have: its own words, in one line.
    assert main([*base, "env.camera=nocamera"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "nocamera" in err, err


@pytest.mark.slow
def test_ppo_of_a_tiny_vla_on_the_camera_runs_end_to_end(tmp_path, capsys):
    import json

    from rlinf_jax.cli.evaluate import main as evaluate_main
    from rlinf_jax.runtime import read_metrics
    from rlinf_jax.cli.train import main

    _python()
    assert main(["--config-name", "ppo_vla_robosuite_lift", "env.num_envs=2", "env.num_workers=1",
                 "env.num_eval_envs=1", "env.image_size=16", "env.episode_length=3", "algorithm.rollout_length=2",
                 "algorithm.num_minibatches=1", "runner.max_steps=2", "runner.eval_interval=2",
                 "runner.save_interval=2", "runner.progress_bar=false", "runner.tensorboard=false",
                 f"runner.output_dir={tmp_path}"]) == 0
    metrics = read_metrics(tmp_path / "ppo_vla_robosuite_lift")
    last = metrics[-1]
    assert last["step"] == 2 and np.isfinite(last["train/total_loss"]) and last["train/grad_norm"] > 0
    assert last["env/episodes"] >= 2  # 4 steps per env of 3-step episodes: one ended each
    assert "eval/success" in last and np.isfinite(last["eval/return"])
    capsys.readouterr()
    # The saved VLA evaluates on the camera in a pool of its own.
    assert evaluate_main([str(tmp_path / "ppo_vla_robosuite_lift")]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 2 and np.isfinite(result["eval/return"])
