#!/usr/bin/env python
"""robosuite's and LIBERO's cameras through the env workers: env-steps/s of a `HostEnvPool`
stepped with random actions (no policy), with and without the ``agentview`` camera.

For each task, observation (state only; the camera at each ``--sizes`` px) and layout
(1 env on 1 worker; 2 envs on 2 workers), the pool steps ``--warmup`` untimed steps and
then ``--steps`` timed ones. A task is a robosuite environment's name or a full env name
(``libero:libero_object/0``). Needs the simulator's worker environment (``python -m
rlinf_jax.envs.install robosuite``, ``.. libero --assets``); rendering is EGL's unless
``MUJOCO_GL`` says otherwise. The last stdout line is JSON: one row per configuration.

    python benchmarks/hostsim_camera.py                         # Lift; state, 64 px, 128 px
    python benchmarks/hostsim_camera.py --tasks Lift Stack Door PickPlaceCan --sizes 64 --layouts 1
    python benchmarks/hostsim_camera.py --tasks libero:libero_object/0 libero:libero_spatial/0
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from rlinf_jax.envs.host import HostEnvPool, HostEnvSpec, describe
from rlinf_jax.envs.install import assets_dir, recorded_python


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=["Lift"])
    p.add_argument("--sizes", nargs="+", type=int, default=[0, 64, 128], help="0: state only")
    p.add_argument("--layouts", nargs="+", type=int, default=[1, 2], help="envs = workers")
    p.add_argument("--camera", default="agentview")
    p.add_argument("--steps", type=int, default=35)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    rows = []
    for task in args.tasks:
        env_id = task if ":" in task else f"robosuite:{task}"
        simulator = env_id.split(":")[0]
        python, assets = recorded_python(simulator), assets_dir(simulator)
        for size in args.sizes:
            camera = args.camera if size else ""
            # A time limit no timed step reaches: resets (a rebuilt simulation) are not timed.
            spec = describe(HostEnvSpec(env_id, episode_length=10**6, python=python, camera=camera,
                                        image_size=size, assets_dir=assets))
            for n in args.layouts:
                pool = HostEnvPool(spec, num_envs=n, num_workers=n, seed=0)
                try:
                    act = np.random.default_rng(0).uniform(-1, 1, (args.warmup + args.steps, n, spec.action_size))
                    act = act.astype(np.float32)
                    for a in act[: args.warmup]:
                        pool.step(a)
                    t = time.perf_counter()
                    for a in act[args.warmup :]:
                        pool.step(a)
                    rate = args.steps * n / (time.perf_counter() - t)
                finally:
                    pool.close()
                row = {"task": task, "camera": camera or None, "image_size": size, "envs": n, "workers": n,
                       "env_steps_per_sec": round(rate, 1)}
                print(row, flush=True)
                rows.append(row)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
