"""Each side of a benchmark in a process of its own, timed in turns.

The parent starts one child per side: the same script again with ``--side NAME`` (and the
core it is pinned to, which the script pins before torch or JAX start a thread). Each child
builds its side, warms it up and says it is ready, with what the parent needs of it (the
outputs the parity check compares, a FLOP count); then the parent asks the children in
turn for one timed run each, round after round. So load from other processes hits every
side alike, no two sides ever run at once, and the sides share nothing: not an allocator,
not a thread pool, not torch's or JAX's global settings.

The children answer on stdout in lines that start with ``MARK`` followed by JSON; anything
else a child prints (a library's warning, its own progress) goes on to our stderr. A child
that dies ends the parent with one ``error:`` line naming the side.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable

MARK = "@side "


class SideProcess:
    """A child process running one side: ``run()`` times one call of it."""

    def __init__(self, name: str, cmd: list[str]):
        self.name = name
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def _answer(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:  # the child is gone
                code = self.proc.wait()
                raise SystemExit(f"error: the {self.name} side's process exited with {code}; its output is above")
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
            sys.stderr.write(line)

    def ready(self) -> dict:
        """What the child says once its side is built and warmed up."""
        return self._answer()

    def run(self) -> dict:
        """One timed call in the child: ``{"wall": s, "cpu": s}`` (the child's process CPU time)."""
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.proc.stdin.close()


@contextlib.contextmanager
def running_sides(commands: dict[str, list[str]]):
    """The children of ``commands`` started one after another (each builds and compiles
    alone): yields ``(sides, what each said when ready)`` and closes every one started,
    whatever happens."""
    sides, infos = {}, {}
    try:
        for name, cmd in commands.items():
            sides[name] = SideProcess(name, cmd)
            infos[name] = sides[name].ready()
        yield sides, infos
    finally:
        for side in sides.values():
            side.close()


def timed_in_turns(sides: dict[str, SideProcess], repeats: int) -> dict[str, list[dict]]:
    """``repeats`` rounds, each side's timed call in turn within a round."""
    times: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, side in sides.items():
            times[name].append(side.run())
    return times


def serve(run_once: Callable[[], object], ready: dict) -> None:
    """The child's half: says ``ready``, then times ``run_once`` on each request until told
    to quit (or its parent is gone)."""
    print(MARK + json.dumps(ready), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            return
        if command != "run":
            raise SystemExit(f"error: unknown request {command!r} from the parent")
        wall, cpu = time.perf_counter(), time.process_time()
        run_once()
        print(MARK + json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}), flush=True)
