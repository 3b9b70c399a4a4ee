"""``corpus_qa``: question answering by searching a user-supplied corpus.

Two input shapes, detected per file (or forced with ``format=``):

- **BrowseComp-Plus** (the decrypted queries): ``query_id``, ``query``, ``answer`` and the
  evidence as ``gold_docs`` and/or ``evidence_docs`` (lists of doc ids, or of objects with a
  ``docid``), searched over its corpus of ``docid``, ``text``, ``url``.
- **Generic JSONL**: ``{"id", "question", "answer"}`` (the answer a string or a list of accepted
  answers) over a corpus of ``{"id" or "docid", "text", "title"?, "url"?}``. Without evidence
  ids, the documents that contain the answer are taken as evidence for the oracle.

Files may be JSONL, a JSON list, or Parquet. A row with a missing field is an error that names the
file, the line and the field; documents the queries cite but the corpus lacks are counted in
``env.report``. Tools: ``search`` (BM25), ``open`` (the full document) and ``answer``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from acmrl.envs.base import EnvError, Environment, Handler, Plan, Task
from acmrl.envs.scoring import Judge, normalize_answer
from acmrl.envs.search import Document, SearchIndex

FORMATS = ("auto", "browsecomp", "jsonl")
_QUERY_FIELDS = {
    "browsecomp": ("query_id", "query", "answer"),
    "jsonl": ("id", "question", "answer"),
}


def read_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` pairs from a JSONL, JSON-list or Parquet file."""
    if not path.is_file():
        raise EnvError(f"corpus_qa: no such file {str(path)!r}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # installed with datasets

        return list(enumerate(pq.read_table(path).to_pylist(), 1))
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" or text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EnvError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from exc
        if not isinstance(rows, list):
            raise EnvError(f"{path}: a JSON file must hold a list of objects")
        out = list(enumerate(rows, 1))
    else:
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append((n, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise EnvError(f"{path}:{n}: not valid JSON ({exc.msg})") from exc
    for n, row in out:
        if not isinstance(row, dict):
            raise EnvError(f"{path}:{n}: each row must be a JSON object, got {type(row).__name__}")
    return out


def _require(path: Path, n: int, row: dict[str, Any], names: tuple[str, ...], what: str) -> None:
    missing = [k for k in names if row.get(k) in (None, "")]
    if missing:
        raise EnvError(
            f"{path}:{n}: missing field(s) {missing}; {what} needs {', '.join(names)} "
            f"(the row has {sorted(row)})"
        )


def _doc_ids(value: Any) -> list[str]:
    if not value:
        return []
    if isinstance(value, str | int):
        value = [value]
    out = []
    for item in value:
        doc_id = item.get("docid", item.get("id")) if isinstance(item, dict) else item
        if doc_id is not None:
            out.append(str(doc_id))
    return out


def load_corpus(path: Path) -> list[Document]:
    docs = []
    for n, row in read_rows(path):
        id_field = "docid" if "docid" in row else "id"
        _require(path, n, row, (id_field, "text"), "a corpus document")
        text = str(row["text"])
        title = str(row.get("title") or text.strip().split("\n", 1)[0][:80])
        docs.append(Document(str(row[id_field]), title, text, str(row.get("url") or "")))
    if not docs:
        raise EnvError(f"{path}: the corpus is empty")
    seen: set[str] = set()
    for d in docs:
        if d.id in seen:
            raise EnvError(f"{path}: document id {d.id!r} occurs more than once")
        seen.add(d.id)
    return docs


class CorpusQA(Environment):
    """The ``corpus_qa`` environment; see the module docstring."""

    name = "corpus_qa"

    def __init__(
        self,
        queries: str | os.PathLike[str],
        corpus: str | os.PathLike[str],
        *,
        format: str = "auto",
        eval_frac: float = 0.2,
        search_k: int = 5,
        max_context_tokens: int = 32768,
        metric: str = "em",
        judge: Judge | None = None,
    ) -> None:
        super().__init__(metric=metric, judge=judge)
        if format not in FORMATS:
            raise EnvError(f"corpus_qa format={format!r} is not known; choose one of {FORMATS}")
        if not 0.0 <= eval_frac <= 1.0:
            raise EnvError(f"corpus_qa eval_frac={eval_frac} must be between 0 and 1")
        self.max_context_tokens = max_context_tokens
        self.index = SearchIndex(load_corpus(Path(corpus)), k=search_k)
        self.documents = self.index.docs
        self.report = {"queries": 0, "missing_gold_docs": 0, "without_evidence": 0}
        self._tasks = {"train": [], "eval": []}
        seen: set[str] = set()
        qpath = Path(queries)
        for n, row in read_rows(qpath):
            task = self._task(qpath, n, row, format)
            if task.id in seen:
                raise EnvError(f"{qpath}:{n}: query id {task.id!r} occurs more than once")
            seen.add(task.id)
            bucket = int(hashlib.sha1(task.id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
            split = row.get("split") or ("eval" if bucket < eval_frac else "train")
            task.metadata["split"] = split
            self._tasks.setdefault(split, []).append(task)
        if not seen:
            raise EnvError(f"{qpath}: no queries")

    def _task(self, path: Path, n: int, row: dict[str, Any], fmt: str) -> Task:
        if fmt == "auto":
            fmt = "browsecomp" if "query_id" in row or "query" in row else "jsonl"
        _require(path, n, row, _QUERY_FIELDS[fmt], f"a {fmt} query")
        qid, question = (
            (row["query_id"], row["query"]) if fmt == "browsecomp" else (row["id"], row["question"])
        )
        answer = row["answer"]
        answer = [str(a) for a in answer] if isinstance(answer, list) else str(answer)
        cited = _doc_ids(row.get("gold_docs")) or _doc_ids(row.get("evidence_docs"))
        present = [d for d in cited if d in self.index.by_id]
        self.report["queries"] += 1
        self.report["missing_gold_docs"] += len(cited) - len(present)
        derived = not cited
        if derived:
            present = self._docs_with_answer(str(question), answer)
        if not present:
            self.report["without_evidence"] += 1
        return Task(
            id=f"corpus_qa/{qid}",
            prompt=f"{question}\n\nSearch the corpus to find the answer, then submit a short answer.",
            answer=answer,
            metadata={
                "env": self.name,
                "format": fmt,
                "question": str(question),
                "gold_docs": present,
                "gold_derived": derived,
            },
        )

    def _docs_with_answer(self, question: str, answer: str | list[str]) -> list[str]:
        """Evidence for a query that cites none: the best-ranked hits that contain the answer."""
        answers = [answer] if isinstance(answer, str) else answer
        wanted = [f" {normalize_answer(a)} " for a in answers if normalize_answer(a)]
        hits = self.index.search(question, k=50)
        for doc, _ in hits:
            if any(w in f" {normalize_answer(doc.text)} " for w in wanted):
                return [doc.id]
        return []

    def tools(self) -> list[dict[str, Any]]:
        return self.index.tools("the document corpus")

    def _handlers(self, task: Task) -> dict[str, Handler]:
        return self.index.handlers()

    def oracle_plan(self, task: Task) -> Plan:
        plan: Plan = [("search", {"query": task.metadata["question"]})]
        plan += [("open", {"doc_id": d}) for d in task.metadata["gold_docs"]]
        answer = task.answer if isinstance(task.answer, str) else task.answer[0]
        return [*plan, ("answer", {"text": answer})]
