"""Runs a command-line entry point (`train`, `evaluate`, `convert`, `collect`, `launch`) in a child process,
optionally with a fault injected into checkpoint saving, and records when ``main`` returned
so that the parent can tell how long the interpreter then took to exit.

    python tests/child_main.py MARKER_FILE train [train arguments]

``RLINF_TEST_FAULT`` = ``sigint`` (a real SIGINT while a checkpoint save is in flight) or
``enospc`` (the save fails with a full disk), at the save numbered
``RLINF_TEST_FAULT_AT`` (1-based, default 2). With ``RLINF_TEST_FAULT_WHERE=thread`` the
fault comes from inside orbax's own background thread that writes the metadata once the
arrays are committed, with the save's other threads still running: where a real Ctrl-C
or a real full disk meets a save most of the time.
"""

import errno
import os
import signal
import sys
import time

# A user's shell starts a command with SIGINT at its default, which Python turns into
# KeyboardInterrupt. A child of a process that ignores SIGINT inherits the ignore (and
# Python then leaves it ignored): give it the user's disposition.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

fault = os.environ.get("RLINF_TEST_FAULT", "")
if fault:
    import orbax.checkpoint as ocp

    real_save = ocp.CheckpointManager.save
    calls = {"n": 0}
    fault_at = int(os.environ.get("RLINF_TEST_FAULT_AT", "2"))

    def save(self, *args, **kwargs):
        calls["n"] += 1
        out = real_save(self, *args, **kwargs)  # the data is written; the fault comes before the step is final
        if calls["n"] == fault_at:
            if fault == "sigint":
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(10)  # the KeyboardInterrupt lands here
            elif fault == "enospc":
                raise OSError(errno.ENOSPC, "No space left on device")
        return out

    if os.environ.get("RLINF_TEST_FAULT_WHERE") == "thread":
        from orbax.checkpoint._src.handlers import base_pytree_checkpoint_handler as handler

        real_write = handler.BasePyTreeCheckpointHandler._write_metadata_after_commits

        async def write_metadata(self, *args, **kwargs):
            if calls["n"] == fault_at:
                if fault == "sigint":
                    os.kill(os.getpid(), signal.SIGINT)  # lands in the main thread, waiting on this one
                    time.sleep(0.5)
                elif fault == "enospc":
                    raise OSError(errno.ENOSPC, "No space left on device")
            return await real_write(self, *args, **kwargs)

        handler.BasePyTreeCheckpointHandler._write_metadata_after_commits = write_metadata

        def save(self, *args, **kwargs):
            calls["n"] += 1
            return real_save(self, *args, **kwargs)

    ocp.CheckpointManager.save = save

marker, entry, *argv = sys.argv[1:]
if entry == "train":
    from rlinf_jax.cli.train import main
elif entry == "evaluate":
    from rlinf_jax.cli.evaluate import main
elif entry == "collect":
    from rlinf_jax.collect import main
elif entry == "launch":
    from rlinf_jax.launch import main
else:
    from rlinf_jax.cli.convert import main
code = main(argv)
with open(marker, "w") as f:
    f.write(repr(time.time()))
sys.exit(code)
