"""``corpus_qa``: question answering by searching a user-supplied corpus.

Two input shapes, detected per file (or forced with ``format=``):

- **BrowseComp-Plus** (the decrypted queries): ``query_id``, ``query``, ``answer`` and the
  evidence as ``gold_docs`` and/or ``evidence_docs`` (lists of doc ids, or of objects with a
  ``docid``), searched over its corpus of ``docid``, ``text``, ``url``.
- **Generic JSONL**: ``{"id", "question", "answer"}`` (the answer a string or a list of accepted
  answers) over a corpus of ``{"id" or "docid", "text", "title"?, "url"?}``. Without evidence
  ids, the documents that contain the answer are taken as evidence for the oracle.

Answers of either shape may carry **aliases** and form **answer sets**:

- ``"aliases": ["NYC", ...]``: other accepted forms of a single answer (any one is correct);
- ``"answer_set": true`` with a list in ``answer`` (or ``answers``): every item is required, as
  multi-part (FanOutQA-style) questions need. The score is the set F1 of the items the answer lists
  (split on commas, semicolons, new lines and "and"), so one right part of four scores 0.4 and
  only all four score 1 (success). An item may itself be a list, ``["New York", "NYC"]``: its
  first form and its aliases; or ``aliases`` maps items to their forms
  (``{"New York": ["NYC"]}``) or lists them per item (``[["NYC"], []]``).

Files may be JSONL, a JSON list, or Parquet. A row with a missing field is an error that names the
file, the line and the field; documents the queries cite but the corpus lacks are counted in
``env.report``. Tools: ``search`` (BM25), ``open`` (the full document) and ``answer``.

``preset="browsecomp-plus"`` runs BrowseComp-Plus as the ACM reference did (docs/envs.md):
the top 10 results, each with a snippet of its first 512 tokens, ``open`` cut at 8,192 tokens,
a line in the task that points to ``query_memory``, and an LLM judge as the metric
(``env.judge``); each setting can still be given (``metric="em"`` is the exact-match fallback
the tests use). Tokens are counted by ``tokenizer`` (default: the embedded model's).
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
DEFAULTS: dict[str, Any] = {
    "search_k": 5,
    "snippet_tokens": None,  # snippets of 20 words
    "document_tokens": None,  # open returns the whole document
    "memory_hint": False,
    "metric": "em",
}
# BrowseComp-Plus as the ACM reference ran it (docs/envs.md has the table beside the reference's)
PRESETS: dict[str, dict[str, Any]] = {
    "browsecomp-plus": {
        "search_k": 10,
        "snippet_tokens": 512,
        "document_tokens": 8192,
        "memory_hint": True,
        "metric": "judge",
    },
}
MEMORY_HINT = (
    " Results you compacted away stay in the archive: query_memory retrieves them by id when "
    "you have that tool."
)
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
    if "answer" in missing and row.get("answers") not in (None, "", []):
        missing.remove("answer")  # a set's items may come as "answers"
    if missing:
        raise EnvError(
            f"{path}:{n}: missing field(s) {missing}; {what} needs {', '.join(names)} "
            f"(the row has {sorted(row)})"
        )


def _answers(
    path: Path, n: int, row: dict[str, Any]
) -> tuple[str | list[str], bool, dict[str, list[str]]]:
    """A row's answer, whether it is a set of required items, and the aliases of its answers."""
    where = f"{path}:{n}"
    value = row["answer"] if row.get("answer") not in (None, "") else row.get("answers")
    answer_set = row.get("answer_set", False)
    if not isinstance(answer_set, bool):
        raise EnvError(f"{where}: answer_set must be true or false, got {answer_set!r}")
    aliases: dict[str, list[str]] = {}

    def forms(item: Any, what: str) -> str:
        if isinstance(item, list):  # ["New York", "NYC"]: the first form and its aliases
            if not item or not all(isinstance(f, str | int | float) for f in item):
                raise EnvError(f"{where}: {what} must be a string or a non-empty list of strings")
            first = str(item[0])
            aliases.setdefault(first, []).extend(str(f) for f in item[1:])
            return first
        if not isinstance(item, str | int | float) or isinstance(item, bool):
            raise EnvError(f"{where}: {what} must be a string, got {type(item).__name__}")
        return str(item)

    if answer_set:
        if not isinstance(value, list) or not value:
            raise EnvError(f"{where}: answer_set needs a non-empty list of items in 'answer'")
        answer: str | list[str] = [forms(item, "each answer item") for item in value]
    elif isinstance(value, list):
        answer = [forms(item, "each accepted answer") for item in value]
    else:
        answer = forms(value, "answer")
    extra = row.get("aliases")
    items = [answer] if isinstance(answer, str) else answer
    if extra is None:
        pass
    elif isinstance(extra, dict):
        for key, alts in extra.items():
            if key not in items:
                raise EnvError(f"{where}: aliases names {key!r}, which is not one of the answers")
            if not isinstance(alts, list) or not all(isinstance(a, str) for a in alts):
                raise EnvError(f"{where}: the aliases of {key!r} must be a list of strings")
            aliases.setdefault(key, []).extend(alts)
    elif isinstance(extra, list) and all(isinstance(a, str) for a in extra) and len(items) == 1:
        aliases.setdefault(items[0], []).extend(extra)
    elif (
        isinstance(extra, list)
        and len(extra) == len(items)
        and all(isinstance(alts, list) and all(isinstance(a, str) for a in alts) for alts in extra)
    ):
        for item, alts in zip(items, extra, strict=True):
            aliases.setdefault(item, []).extend(alts)
    else:
        raise EnvError(
            f"{where}: aliases must be a list of strings (one answer), a list of lists (one per "
            f"answer item) or an object mapping answers to lists of strings"
        )
    return answer, answer_set, {k: v for k, v in aliases.items() if v}


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
        preset: str | None = None,
        eval_frac: float = 0.2,
        search_k: int | None = None,
        snippet_tokens: int | None = None,
        document_tokens: int | None = None,
        tokenizer: str | None = None,
        memory_hint: bool | None = None,
        max_context_tokens: int = 32768,
        metric: str | None = None,
        judge: Judge | None = None,
    ) -> None:
        if preset is not None and preset not in PRESETS:
            raise EnvError(
                f"corpus_qa preset={preset!r} is not known; choose one of {list(PRESETS)}"
            )
        p = {**DEFAULTS, **PRESETS.get(preset or "", {})}
        given = dict(
            search_k=search_k,
            snippet_tokens=snippet_tokens,
            document_tokens=document_tokens,
            memory_hint=memory_hint,
            metric=metric,
        )
        p |= {k: v for k, v in given.items() if v is not None}
        super().__init__(metric=p["metric"], judge=judge)
        self.settings = p  # what this instance runs with (docs/envs.md's table)
        if format not in FORMATS:
            raise EnvError(f"corpus_qa format={format!r} is not known; choose one of {FORMATS}")
        if not 0.0 <= eval_frac <= 1.0:
            raise EnvError(f"corpus_qa eval_frac={eval_frac} must be between 0 and 1")
        self.max_context_tokens = max_context_tokens
        tok = None
        if p["snippet_tokens"] or p["document_tokens"]:
            from acmrl.config import DEFAULT_MODEL
            from acmrl.models import load_tokenizer

            tok = load_tokenizer(tokenizer or DEFAULT_MODEL)
        self.index = SearchIndex(
            load_corpus(Path(corpus)),
            k=p["search_k"],
            snippet_tokens=p["snippet_tokens"],
            document_tokens=p["document_tokens"],
            tokenizer=tok,
        )
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
        answer, answer_set, aliases = _answers(path, n, row)
        cited = _doc_ids(row.get("gold_docs")) or _doc_ids(row.get("evidence_docs"))
        present = [d for d in cited if d in self.index.by_id]
        self.report["queries"] += 1
        self.report["missing_gold_docs"] += len(cited) - len(present)
        derived = not cited
        if derived:
            present = self._docs_with_answer(str(question), answer, answer_set, aliases)
        if not present:
            self.report["without_evidence"] += 1
        return Task(
            id=f"corpus_qa/{qid}",
            prompt=f"{question}\n\nSearch the corpus to find the answer, then submit a short answer."
            + (MEMORY_HINT if self.settings["memory_hint"] else ""),
            answer=answer,
            metadata={
                "env": self.name,
                "format": fmt,
                "question": str(question),
                "gold_docs": present,
                "gold_derived": derived,
                **({"answer_set": True} if answer_set else {}),
                **({"aliases": aliases} if aliases else {}),
            },
        )

    def _docs_with_answer(
        self,
        question: str,
        answer: str | list[str],
        answer_set: bool = False,
        aliases: dict[str, list[str]] | None = None,
    ) -> list[str]:
        """Evidence for a query that cites none: the best-ranked hit that contains the answer (in
        any accepted form); for an answer set, one such hit per item."""
        answers = [answer] if isinstance(answer, str) else answer
        groups = [[a, *(aliases or {}).get(a, [])] for a in answers]
        if not answer_set:
            groups = [[form for group in groups for form in group]]
        hits = self.index.search(question, k=50)
        texts = [(doc.id, f" {normalize_answer(doc.text)} ") for doc, _ in hits]
        found: list[str] = []
        for group in groups:
            wanted = [f" {normalize_answer(a)} " for a in group if normalize_answer(a)]
            doc_id = next((d for d, text in texts if any(w in text for w in wanted)), None)
            if doc_id is not None and doc_id not in found:
                found.append(doc_id)
        return found

    def tools(self) -> list[dict[str, Any]]:
        return self.index.tools("the document corpus")

    def _handlers(self, task: Task) -> dict[str, Handler]:
        return self.index.handlers()

    def oracle_plan(self, task: Task) -> Plan:
        plan: Plan = [("search", {"query": task.metadata["question"]})]
        plan += [("open", {"doc_id": d}) for d in task.metadata["gold_docs"]]
        if isinstance(task.answer, str):
            answer = task.answer
        elif task.metadata.get("answer_set"):
            answer = ", ".join(task.answer)
        else:
            answer = task.answer[0]
        return [*plan, ("answer", {"text": answer})]
