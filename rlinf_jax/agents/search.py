"""The search tool: BM25 over a local document collection.

Documents come from files the user points to: a folder of ``.txt`` / ``.md`` files (one
document per file) or a ``.jsonl`` file with a ``text`` field per line (``title`` optional).
The index is ``bm25s`` (an optional extra, ``pip install rlinf-jax[agents]``), built on the
first query in this process (or by the tool executor before its first timed call), and by a
tool worker as it unpickles the tool (before the call's time limit starts), then kept; the
index itself is never pickled. A query returns the ``top_k`` best documents, each cut to
``max_chars`` characters, so the observation stays inside the token budget.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlinf_jax.errors import BadInput

MAX_QUERY_CHARS = 300


def load_documents(path) -> list[str]:
    """The collection's texts; `BadInput` for a path that holds none."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.suffix in (".txt", ".md") and f.is_file())
        docs = [f.read_text(encoding="utf-8-sig", errors="replace").strip() for f in files]
    elif p.is_file() and p.suffix == ".jsonl":
        docs = []
        for n, line in enumerate(p.read_text(encoding="utf-8-sig").splitlines(), 1):  # a byte-order mark is no text
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                text = str(rec["text"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise BadInput(f"{p}:{n} is not a JSON object with a 'text' field") from None
            docs.append(f"{rec['title']}: {text}" if rec.get("title") else text)
    else:
        raise BadInput(f"search documents {p} must be a folder of .txt/.md files or a .jsonl file")
    docs = [d for d in docs if d]
    if not docs:
        raise BadInput(f"search documents {p} hold no text")
    return docs


class SearchTool:
    """``SearchTool(documents)(query) -> text`` of the best matches (BM25)."""

    def __init__(self, documents: list[str], top_k: int = 1, max_chars: int = 200):
        if not documents:
            raise BadInput("the search tool needs at least one document")
        self.documents, self.top_k, self.max_chars = list(documents), int(top_k), int(max_chars)
        self._index = None

    @classmethod
    def from_path(cls, path, top_k: int = 1, max_chars: int = 200) -> SearchTool:
        return cls(load_documents(path), top_k, max_chars)

    def _build(self):
        import bm25s  # optional extra (agents): only runs where the search tool is used

        index = bm25s.BM25()
        index.index(bm25s.tokenize(self.documents, stopwords="en", show_progress=False), show_progress=False)
        return index

    def prepare(self) -> None:
        """Builds the index now (the tool executor calls it before the first timed call)."""
        if self._index is None:
            self._index = self._build()

    def search(self, query: str) -> list[tuple[int, float]]:
        """``[(document index, score)]``, best first, only documents that share a term."""
        import bm25s  # optional extra (agents)

        self.prepare()
        k = min(self.top_k, len(self.documents))
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:
            return []
        ids, scores = self._index.retrieve(tokens, k=k, show_progress=False)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]

    def __call__(self, query: str) -> str:
        query = query.strip()
        if not query:
            raise ValueError("empty query")
        if len(query) > MAX_QUERY_CHARS:
            raise ValueError(f"query longer than {MAX_QUERY_CHARS} characters")
        hits = self.search(query)
        if not hits:
            return "no results"
        return " | ".join(self.documents[i][: self.max_chars] for i, _ in hits)

    def __getstate__(self):
        # Sent to a tool worker without the index: the worker builds its own on arrival.
        return {**self.__dict__, "_index": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.prepare()
