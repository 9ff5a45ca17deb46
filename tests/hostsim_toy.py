"""A tiny Gymnasium env for the host-simulator tests, registered as ``HostsimToy-v0``.

A point on a line: the action moves it by half its value, the episode terminates when it
leaves [-1, 1]. Written in float32 so that its JAX twin (tests/test_hostsim.py) gives the
same numbers. ``hang_file``: the first env to step finds it missing, creates it and hangs
(a worker that misses its deadline); ``crash_file`` the same with an exit.
``crash_every``: every env prints a line to stderr and exits (code 3) at its
``crash_every``-th step, counted over the worker's life (a simulator that keeps crashing).
"""

from __future__ import annotations

import os
import sys
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class HostsimToy(gym.Env):
    def __init__(self, hang_file: str = "", crash_file: str = "", crash_every: int = 0):
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.hang_file, self.crash_file = hang_file, crash_file
        self.crash_every, self.lifetime_steps = crash_every, 0

    def _obs(self):
        return np.array([self.x, np.float32(0.1) * np.float32(self.t)], np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = np.float32(0.0), 0
        return self._obs(), {}

    def step(self, action):
        for path, act in ((self.hang_file, lambda: time.sleep(600)), (self.crash_file, lambda: os._exit(3))):
            if path and not os.path.exists(path):
                open(path, "w").close()
                act()
        self.lifetime_steps += 1
        if self.crash_every and self.lifetime_steps % self.crash_every == 0:
            print(f"toy simulator: giving up at step {self.lifetime_steps}", file=sys.stderr, flush=True)
            os._exit(3)
        self.x = np.float32(self.x + np.float32(0.5) * np.float32(action[0]))
        self.t += 1
        reward = np.float32(1.0) - self.x * self.x
        return self._obs(), float(reward), bool(abs(self.x) > 1.0), False, {}


gym.register("HostsimToy-v0", entry_point=HostsimToy)
