"""Prompt/answer datasets and the resumable shuffling loader that feeds the reasoning flow.

Sources: local JSON Lines / JSON / Parquet files with configurable keys, the procedural math
generator, and (optional package) ``reasoning-gym`` tasks. Every dataset is a random-access
sequence of ``{"prompt", "answer", "id", ...}`` records, so one loader serves all of them.

Bad files fail at load time with one ``BadInput`` line naming the file, the line or row, and
the fix, before any compilation starts. The loader's cursor (epoch, position) is all the state
it has: the order of an epoch is a pure function of (seed, epoch), so saving the cursor in a
checkpoint and restoring it continues with exactly the batches an uninterrupted run would see.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlinf_jax.data.math_tasks import ProceduralMathDataset
from rlinf_jax.data.search_tasks import ToolSearchDataset
from rlinf_jax.data.tool_tasks import ToolTaskDataset
from rlinf_jax.errors import BadInput

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def _one_line(err) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _lookup(record: dict, key: str):
    """``record[key]``; a dotted key (``reward_model.ground_truth``) walks nested records.
    Returns ``(found, value)``."""
    if key in record:
        return True, record[key]
    value = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _type_name(v) -> str:
    return "null" if v is None else type(v).__name__


def _record(raw, where: str, path: Path, prompt_key: str, answer_key: str, default_id: str) -> dict:
    """Check one raw record and turn it into ``{"prompt", "answer", "id"}``."""
    if not isinstance(raw, dict):
        raise BadInput(f"{path} {where}: expected a JSON object per record, got {_type_name(raw)}; write one object per line")
    rec = {}
    for field, key in (("prompt", prompt_key), ("answer", answer_key)):
        found, value = _lookup(raw, key)
        if not found:
            keys = ", ".join(sorted(map(str, raw))[:8]) or "none"
            raise BadInput(
                f"{path} {where} has no key {key!r} (its keys: {keys}); set data.{field}_key to the {field}'s key"
            )
        rec[field] = value
    prompt = rec["prompt"]
    if not isinstance(prompt, str):
        is_messages = isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        )
        if not is_messages:
            raise BadInput(
                f"{path} {where}: {prompt_key!r} is {_type_name(prompt)}, expected a string or a list of "
                '{"role", "content"} messages; fix that record'
            )
    answer = rec["answer"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise BadInput(f"{path} {where}: {answer_key!r} is {_type_name(answer)}, expected a string or a number; fix that record")
    rec["answer"] = answer if isinstance(answer, str) else str(answer)
    rid = raw.get("id", default_id)
    rec["id"] = str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) else default_id
    return rec


# Integers longer than this stay digit strings: Python refuses to turn more than 4,300 digits
# into an int, and an answer is compared as text in any case.
_MAX_INT_DIGITS = 4000


def _json_int(text: str):
    return int(text) if len(text) <= _MAX_INT_DIGITS else text


def _loads(text: str, path: Path, where: str, fix: str):
    """One JSON document; what the parser cannot take (bad syntax, nesting deeper than the
    interpreter's recursion limit) is one ``BadInput`` naming where."""
    try:
        return json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as e:
        line = f"line {e.lineno}" if where == "" else where
        raise BadInput(f"{path} {line}: not valid JSON ({e.msg}); {fix}") from None
    except RecursionError:
        raise BadInput(f"{path} {where or 'file'}: JSON nested too deeply to read; {fix}") from None
    except ValueError as e:  # e.g. a float literal Python cannot convert
        raise BadInput(f"{path} {where or 'file'}: unreadable JSON value ({_one_line(e)}); {fix}") from None


def _read_json_records(path: Path):
    """``[(where, record)]`` from JSON Lines, or from a JSON file holding one array."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (Windows editors write one) is no record
    except UnicodeDecodeError as e:
        raise BadInput(f"{path} is not UTF-8 text ({_one_line(e)}); give a JSON Lines or Parquet file") from None
    except OSError as e:
        raise BadInput(f"cannot read data file {path} ({e.strerror or _one_line(e)}); check the path and its permissions") from None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        rows = _loads(text, path, "", "fix the file")
        return [(f"record {i + 1}", r) for i, r in enumerate(rows)]
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        out.append((f"line {lineno}", _loads(line, path, f"line {lineno}", "fix or remove that line")))
    return out


def _read_parquet_records(path: Path, keys):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise BadInput(f"reading {path} needs pyarrow; pip install pyarrow") from None
    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        # Read only the columns the keys need (a dotted key needs its top-level struct column).
        wanted = [n for n in names if any(k == n or k.startswith(n + ".") for k in keys) or n == "id"]
        table = pf.read(columns=wanted)
    except OSError as e:
        raise BadInput(f"cannot read Parquet file {path} ({_one_line(e)}); check that it is a complete Parquet file") from None
    except Exception as e:  # pyarrow raises ArrowInvalid and friends for corrupt files
        raise BadInput(f"{path} is not a readable Parquet file ({_one_line(e)}); rewrite it with pyarrow or pandas") from None
    if table.num_rows == 0:
        return [], names
    return [(f"row {i + 1}", r) for i, r in enumerate(table.to_pylist())], names


class PromptDataset(Sequence):
    """Records ``{"prompt", "answer", "id"}`` held in memory."""

    def __init__(self, records: list[dict], name: str = "dataset"):
        self.records = records
        self.name = name

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index):
        return self.records[index]


def load_prompt_dataset(path, prompt_key: str = "prompt", answer_key: str = "answer") -> PromptDataset:
    """A dataset from a local ``.jsonl`` / ``.json`` / ``.parquet`` file.

    Each record needs ``prompt_key`` (a string, or a list of chat messages) and ``answer_key``
    (a string or a number, kept as text); dotted keys reach into nested records. An ``id`` field
    is kept when present.
    """
    path = Path(path)
    if not path.exists():
        raise BadInput(f"data file {path} does not exist; set data.train_path / data.eval_path to an existing file")
    if path.is_dir():
        raise BadInput(f"data file {path} is a directory; point to a .jsonl or .parquet file inside it")
    if path.suffix not in FILE_SUFFIXES:
        raise BadInput(f"data file {path} has an unsupported extension; use one of {', '.join(FILE_SUFFIXES)}")
    try:
        if path.stat().st_size == 0:
            raise BadInput(f"data file {path} is empty; give a file with at least one record")
    except OSError as e:
        raise BadInput(f"cannot read data file {path} ({e.strerror or _one_line(e)}); check the path and its permissions") from None
    if path.suffix == ".parquet":
        rows, columns = _read_parquet_records(path, (prompt_key, answer_key))
        for key, field in ((prompt_key, "prompt"), (answer_key, "answer")):
            if key.split(".")[0] not in columns:
                raise BadInput(
                    f"{path} has no column {key!r} (its columns: {', '.join(columns[:8])}); set data.{field}_key to the {field}'s column"
                )
    else:
        rows = _read_json_records(path)
    if not rows:
        raise BadInput(f"data file {path} holds no records; give a file with at least one record")
    records = [_record(raw, where, path, prompt_key, answer_key, f"{path.stem}-{i}") for i, (where, raw) in enumerate(rows)]
    return PromptDataset(records, name=str(path))


class ReasoningGymDataset(Sequence):
    """``size`` items of a ``reasoning-gym`` task as ``{"prompt", "answer", "id"}`` records.

    Answers are checked by the same math reward as other sources, which suits the numeric
    tasks (``basic_arithmetic``, ``chain_sum``, ``leg_counting``, ...). reasoning-gym does not
    keep two seeds' items apart, so a train/eval pair is independent, not disjoint.
    """

    def __init__(self, task: str, size: int, seed: int = 0):
        try:
            import reasoning_gym
        except ImportError:
            raise BadInput(
                "data.source=reasoning_gym needs the reasoning-gym package; pip install 'rlinf-jax[reasoning]' "
                "or use data.source=procedural"
            ) from None
        if size <= 0:
            raise BadInput(f"reasoning-gym dataset size {size} must be positive")
        try:
            self._ds = reasoning_gym.create_dataset(task, size=int(size), seed=int(seed))
        except Exception as e:
            raise BadInput(f"reasoning-gym task {task!r} could not be created ({_one_line(e)}); set data.reasoning_gym_task to a registered task") from None
        self.task, self.size, self.seed = task, int(size), int(seed)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.size))]
        index = int(index) + (self.size if int(index) < 0 else 0)
        if not 0 <= index < self.size:
            raise IndexError(index)  # reasoning-gym makes an item for any index; iteration needs an end
        item = self._ds[index]
        return {"prompt": item["question"], "answer": str(item["answer"]), "id": f"{self.task}-{self.seed}-{index}"}


def build_datasets(cfg):
    """``(train, eval)`` datasets for a ``DataConfig``; ``eval`` is None when files are the
    source and no ``eval_path`` is set."""
    cfg.validate()
    if cfg.source == "procedural":
        train = ProceduralMathDataset(cfg.train_size, cfg.train_levels, "train", cfg.seed, cfg.heldout_fraction)
        ev = ProceduralMathDataset(cfg.eval_size, cfg.eval_levels, "heldout", cfg.seed, cfg.heldout_fraction)
        return train, ev
    if cfg.source == "tool_calc":
        kw = {"seed": cfg.seed, "heldout_fraction": cfg.heldout_fraction, "transcripts": cfg.sft_tool_transcripts}
        return (
            ToolTaskDataset(cfg.train_size, cfg.train_levels, "train", tool_fraction=cfg.sft_tool_fraction, **kw),
            ToolTaskDataset(cfg.eval_size, cfg.eval_levels, "heldout", **kw),
        )
    if cfg.source == "tool_search":
        kw = {"seed": cfg.seed, "heldout_fraction": cfg.heldout_fraction, "transcripts": cfg.sft_tool_transcripts}
        return ToolSearchDataset(cfg.train_size, "train", **kw), ToolSearchDataset(cfg.eval_size, "heldout", **kw)
    if cfg.source == "reasoning_gym":
        # Eval items come from a seed stream of their own (seed offset by a large odd constant).
        return (
            ReasoningGymDataset(cfg.reasoning_gym_task, cfg.train_size, cfg.seed),
            ReasoningGymDataset(cfg.reasoning_gym_task, cfg.eval_size, cfg.seed + 1_000_003),
        )
    train = load_prompt_dataset(cfg.train_path, cfg.prompt_key, cfg.answer_key)
    ev = load_prompt_dataset(cfg.eval_path, cfg.prompt_key, cfg.answer_key) if cfg.eval_path else None
    return train, ev


@dataclass
class PromptBatch:
    prompts: list  # strings or chat-message lists, before the template
    answers: list[str]
    ids: list[str]
    indices: np.ndarray  # positions in the dataset
    records: list[dict]


def _batch(dataset, indices) -> PromptBatch:
    recs = [dataset[int(i)] for i in indices]
    return PromptBatch(
        prompts=[r["prompt"] for r in recs],
        answers=[r["answer"] for r in recs],
        ids=[r.get("id", str(int(i))) for r, i in zip(recs, indices)],
        indices=np.asarray(indices, np.int64),
        records=recs,
    )


class PromptLoader:
    """Endless batches of ``batch_size`` prompts, reshuffled each epoch, resumable.

    Epoch ``e`` visits the dataset in the order ``default_rng([seed, e]).permutation(n)``
    (identity when ``shuffle=False``). A batch never straddles epochs: the tail shorter than
    ``batch_size`` is skipped, so every batch has the same static shape. The cursor is
    ``(epoch, position)``; ``state_dict`` / ``load_state_dict`` save and restore it.
    """

    def __init__(self, dataset, batch_size: int, seed: int = 0, shuffle: bool = True):
        n = len(dataset)
        if batch_size <= 0:
            raise BadInput(f"prompt batch size {batch_size} must be positive")
        if batch_size > n:
            raise BadInput(f"prompt batch size {batch_size} exceeds the dataset's {n} records; lower the batch size or add data")
        self.dataset, self.batch_size, self.seed, self.shuffle = dataset, int(batch_size), int(seed), bool(shuffle)
        self.epoch, self.position = 0, 0
        self._order_epoch, self._order = None, None

    def order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            n = len(self.dataset)
            self._order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
            self._order_epoch = epoch
        return self._order

    def next_indices(self) -> np.ndarray:
        if self.position + self.batch_size > len(self.dataset):
            self.epoch, self.position = self.epoch + 1, 0
        idx = self.order(self.epoch)[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return idx

    def __iter__(self):
        return self

    def __next__(self) -> PromptBatch:
        return _batch(self.dataset, self.next_indices())

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "size": len(self.dataset), "shuffle": self.shuffle}

    def load_state_dict(self, state: dict) -> None:
        saved = {k: int(state[k]) for k in ("size", "seed")}
        if saved["size"] != len(self.dataset) or saved["seed"] != self.seed or bool(state.get("shuffle", True)) != self.shuffle:
            raise BadInput(
                f"the data cursor was saved for {saved['size']} records with seed {saved['seed']}, but this run has "
                f"{len(self.dataset)} records with seed {self.seed}; resume with the data settings of the checkpointed run"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def eval_batches(dataset, batch_size: int):
    """Every record once, in order, in batches of ``batch_size`` (the last may be shorter)."""
    if batch_size <= 0:
        raise BadInput(f"eval batch size {batch_size} must be positive")
    for start in range(0, len(dataset), batch_size):
        yield _batch(dataset, np.arange(start, min(start + batch_size, len(dataset))))
