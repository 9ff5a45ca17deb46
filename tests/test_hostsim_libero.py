"""LIBERO tasks in the env workers (env.name=libero:<suite>/<task>, envs/host/libero_task.py).

The configuration checks and the initial-state reader run everywhere; the rest needs
LIBERO's worker environment with its assets (`python -m rlinf_jax.envs.install libero
--assets`) and is skipped without it."""

from __future__ import annotations

import os
import pickle
import zipfile

import numpy as np
import pytest

from rlinf_jax.envs.host import HostEnvPool, HostEnvSpec, describe
from rlinf_jax.envs.host.libero_task import read_init_states
from rlinf_jax.errors import BadInput

TASK = "libero:libero_object/0"


def _installed() -> tuple[str, str]:
    from rlinf_jax.envs.install import assets_dir, recorded_python

    try:
        python = recorded_python("libero")
    except BadInput as e:
        pytest.skip(str(e))
    assets = assets_dir("libero")
    if not assets:
        pytest.skip("LIBERO's assets are not installed: python -m rlinf_jax.envs.install libero --assets")
    return python, assets


def test_a_libero_task_without_assets_is_refused_in_one_line(capsys):
    from rlinf_jax.cli.train import main

    base = ["--config-name", "ppo_vla_libero", "runner.progress_bar=false"]
    for override, words in (([], "env.assets_dir"), (["env.assets_dir=/no/such/folder"], "is not a folder")):
        assert main([*base, *override]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and words in err, err


def test_initial_states_are_read_without_torch_and_nothing_but_arrays_is_unpickled(tmp_path):
    torch = pytest.importorskip("torch")
    states = np.random.default_rng(0).normal(size=(5, 11))
    path = tmp_path / "task.pruned_init"
    torch.save(states, path)  # how LIBERO's files were written
    np.testing.assert_array_equal(read_init_states(str(path)), states)
    # A pickle that would call anything else is refused before it runs.
    evil = tmp_path / "evil.pruned_init"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(os.getcwd))  # a global of the os module
    with pytest.raises(pickle.UnpicklingError, match="numpy arrays only"):
        read_init_states(str(evil))


def _spec(python, assets, camera="", size=0, episode_length=3, reset_mode="fresh"):
    return describe(HostEnvSpec(TASK, episode_length=episode_length, python=python, reset_mode=reset_mode,
                                camera=camera, image_size=size, assets_dir=assets))


def _run(spec, actions, num_workers):
    pool = HostEnvPool(spec, num_envs=actions.shape[1], num_workers=num_workers, seed=5)
    try:
        a = pool.arrays
        out = {"obs0": a["obs"].copy(), "image0": a["image"].copy() if spec.image_shape else None,
               "obs": [], "done": [], "reward": []}
        for step in actions:
            pool.step(step)
            for k in ("obs", "done", "reward"):
                out[k].append(a[k].copy())
        return out
    finally:
        pool.close()


def test_a_libero_task_steps_alike_whatever_the_number_of_workers():
    python, assets = _installed()
    spec = _spec(python, assets)
    # object-state (98) + the Panda's proprio-state (39); 7 OSC_POSE actions; LIBERO's words.
    assert (spec.observation_size, spec.action_size) == (137, 7)
    assert spec.instruction == "pick up the alphabet soup and place it in the basket" and spec.has_success
    actions = np.random.default_rng(0).uniform(-1, 1, (4, 2, 7)).astype(np.float32)
    one, two = _run(spec, actions, 1), _run(spec, actions, 2)
    for k in ("obs", "done", "reward"):
        np.testing.assert_array_equal(np.asarray(one[k]), np.asarray(two[k]))
    np.testing.assert_array_equal(one["obs0"], two["obs0"])
    # Each env starts from the fixed initial state its seed picks: two envs, two states.
    assert not np.array_equal(one["obs0"][0], one["obs0"][1])
    # The 3-step limit ends both episodes as truncations; fresh resets start new states.
    np.testing.assert_array_equal(one["done"][2], 1)
    assert not np.array_equal(one["obs"][2], one["obs0"])


def test_libero_camera_images_and_missing_assets(tmp_path):
    python, assets = _installed()
    spec = _spec(python, assets, camera="agentview", size=16)
    assert spec.image_shape == (16, 16, 3)
    out = _run(spec, np.zeros((1, 1, 7), np.float32), 1)
    assert out["image0"].dtype == np.uint8 and out["image0"].std() > 5  # a rendered scene
    # The same folder less one object the task places: refused in one line naming the file.
    partial = tmp_path / "assets"
    partial.mkdir()
    for entry in os.listdir(assets):
        if entry != "stable_hope_objects":
            os.symlink(os.path.join(assets, entry), partial / entry)
    (partial / "stable_hope_objects").mkdir()
    for entry in os.listdir(os.path.join(assets, "stable_hope_objects")):
        if entry != "alphabet_soup":
            os.symlink(os.path.join(assets, "stable_hope_objects", entry), partial / "stable_hope_objects" / entry)
    with pytest.raises(BadInput) as e:
        _spec(python, str(partial))
    assert "stable_hope_objects/alphabet_soup/alphabet_soup.xml is missing" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(BadInput, match="libero_object has tasks 0..9, not 12"):
        describe(HostEnvSpec("libero:libero_object/12", episode_length=3, python=python, assets_dir=assets))


@pytest.mark.slow
def test_ppo_of_a_tiny_vla_on_a_libero_task_runs_end_to_end(tmp_path):
    from rlinf_jax.runtime import read_metrics
    from rlinf_jax.cli.train import main

    _, assets = _installed()
    assert main(["--config-name", "ppo_vla_libero", f"env.assets_dir={assets}", "env.num_envs=2",
                 "env.num_workers=1", "env.num_eval_envs=1", "env.image_size=16", "env.episode_length=3",
                 "algorithm.rollout_length=2", "algorithm.num_minibatches=1", "runner.max_steps=2",
                 "runner.eval_interval=2", "runner.progress_bar=false", "runner.tensorboard=false",
                 f"runner.output_dir={tmp_path}"]) == 0
    last = read_metrics(tmp_path / "ppo_vla_libero")[-1]
    assert last["step"] == 2 and np.isfinite(last["train/total_loss"]) and last["train/grad_norm"] > 0
    assert last["env/episodes"] >= 2 and "eval/success" in last


def test_asset_packages_are_offered_only_where_they_are_known(capsys, tmp_path):
    from rlinf_jax.envs.install import main

    assert main(["gym", "--assets", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --assets") and "libero" in err and "\n" not in err, err
    assert not any(tmp_path.iterdir())  # refused before anything was built
