"""The run directory: ``<runner.output_dir>/<runner.experiment_name>/``.

    config.yaml      the resolved config (every key), loadable with load_config_file
    metrics.jsonl    one JSON object per logged step
    tensorboard/     tensorboardX event files
    checkpoints/     orbax step folders (checkpoints/<step>/)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlinf_jax.config.loader import config_to_yaml
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.runtime.checkpoint import list_steps
from rlinf_jax.runtime.files import write_atomic


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def config_yaml(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_jsonl(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @classmethod
    def from_config(cls, cfg: Config) -> RunDir:
        """The run directory's paths; touches nothing on disk."""
        return cls(Path(cfg.runner.output_dir) / cfg.runner.experiment_name)

    @classmethod
    def create(cls, cfg: Config) -> RunDir:
        """Makes the folders and writes the resolved config.yaml.

        Call only after every check has passed, so a rejected run leaves no trace. A
        resumed run rewrites config.yaml: it records the invocation that runs now.
        """
        run_dir = cls.from_config(cfg)
        try:
            for d in (run_dir.path, run_dir.tensorboard, run_dir.checkpoints):
                d.mkdir(parents=True, exist_ok=True)
            write_atomic(run_dir.config_yaml, config_to_yaml(cfg))
        except (FileExistsError, NotADirectoryError):
            raise BadInput(
                f"cannot create run directory {run_dir.path}: a file is in the way; "
                "change runner.output_dir or runner.experiment_name"
            ) from None
        except OSError as e:
            raise BadInput(
                f"cannot create run directory {run_dir.path}: {e.strerror or e}; change runner.output_dir"
            ) from None
        return run_dir

    def has_checkpoints(self) -> bool:
        return bool(list_steps(self.checkpoints))
