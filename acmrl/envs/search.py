"""BM25 search over a document collection, and the ``search`` / ``open`` tools built on it.

``kb_search`` and ``corpus_qa`` share this: ``search(query)`` returns the top-k hits as short
snippets (id, title, the first words), ``open(doc_id)`` the full document, which is the bulky
observation that puts pressure on the context budget.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import bm25s

from acmrl.context.render import tool_schema
from acmrl.envs.base import ToolError


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str
    url: str = ""


def _tokenize(texts: list[str]) -> list[list[str]]:
    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class SearchIndex:
    """A BM25 index (``bm25s``) over documents, addressable by id."""

    def __init__(
        self,
        docs: list[Document],
        *,
        k: int = 5,
        snippet_words: int = 20,
        snippet_tokens: int | None = None,
        document_tokens: int | None = None,
        tokenizer: Any = None,
    ) -> None:
        """``snippet_tokens`` (instead of ``snippet_words``) and ``document_tokens`` cut a
        snippet and an opened document at that many tokens of ``tokenizer`` (a Hugging Face
        tokenizer), as BrowseComp-Plus's search tools do; ``None``: no token limit."""
        if (snippet_tokens or document_tokens) and tokenizer is None:
            raise ValueError("snippet_tokens / document_tokens need a tokenizer to count tokens")
        if not docs:
            raise ValueError("a search index needs at least one document")
        self.docs = docs
        self.by_id = {d.id: d for d in docs}
        if len(self.by_id) != len(docs):
            dup = next(d.id for i, d in enumerate(docs) if d.id in {e.id for e in docs[:i]})
            raise ValueError(f"document id {dup!r} occurs more than once")
        self.k = k
        self.snippet_words = snippet_words
        self.snippet_tokens, self.document_tokens = snippet_tokens, document_tokens
        self.tokenizer = tokenizer
        self._bm25 = bm25s.BM25()
        self._bm25.index(_tokenize([f"{d.title}\n{d.text}" for d in docs]), show_progress=False)
        self._vocab = set(self._bm25.vocab_dict)

    def search(self, query: str, k: int | None = None) -> list[tuple[Document, float]]:
        """The best ``k`` documents with a positive BM25 score, best first."""
        return self.search_many([query], k)[0]

    def search_many(
        self, queries: list[str], k: int | None = None
    ) -> list[list[tuple[Document, float]]]:
        """:meth:`search` for many queries at once (one tokenisation and retrieval pass)."""
        words = [[w for w in q if w in self._vocab] for q in _tokenize(queries)] if queries else []
        asked = [i for i, w in enumerate(words) if w]
        out: list[list[tuple[Document, float]]] = [[] for _ in queries]
        if not asked:
            return out
        k = min(k or self.k, len(self.docs))
        ids, scores = self._bm25.retrieve(
            [words[i] for i in asked], k=k, show_progress=False, n_threads=1
        )
        for row, i in enumerate(asked):
            out[i] = [
                (self.docs[int(d)], float(s))
                for d, s in zip(ids[row], scores[row], strict=True)
                if s > 0
            ]
        return out

    def _cut(self, text: str, limit: int) -> tuple[str, int]:
        """``text`` cut to its first ``limit`` tokens, and how many tokens it has."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= limit:
            return text, len(ids)
        return self.tokenizer.decode(ids[:limit]), len(ids)

    def snippet(self, doc: Document) -> str:
        if self.snippet_tokens:
            cut, n = self._cut(" ".join(doc.text.split()), self.snippet_tokens)
            return cut + (" ..." if n > self.snippet_tokens else "")
        words = doc.text.split()
        more = " ..." if len(words) > self.snippet_words else ""
        return " ".join(words[: self.snippet_words]) + more

    def get(self, doc_id: str) -> Document:
        doc = self.by_id.get(doc_id.strip())
        if doc is None:
            close = difflib.get_close_matches(doc_id.strip(), list(self.by_id), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; use an id from search"
            raise ToolError(f"no document with id {doc_id!r}{hint}")
        return doc

    # -- the tools ------------------------------------------------------------------------------

    def tool_search(self, query: str) -> str:
        if not query.strip():
            raise ToolError("search needs a non-empty query")
        hits = self.search(query)
        if not hits:
            return f"No documents match {query!r}. Try other words (names, places, titles)."
        lines = [f"Results for {query!r}:"]
        for doc, _ in hits:
            lines.append(f"[{doc.id}] {doc.title}: {self.snippet(doc)}")
        return "\n".join(lines)

    def tool_open(self, doc_id: str) -> str:
        doc = self.get(doc_id)
        head = f"[{doc.id}] {doc.title}" + (f" ({doc.url})" if doc.url else "")
        text = doc.text
        if self.document_tokens:
            text, n = self._cut(text, self.document_tokens)
            if n > self.document_tokens:
                text += f"\n[document cut: its first {self.document_tokens} of {n} tokens]"
        return f"{head}\n\n{text}"

    def tools(self, what: str) -> list[dict[str, Any]]:
        """Schemas of ``search`` and ``open``; ``what`` describes the collection."""
        return [
            tool_schema(
                "search",
                f"Search {what} by keywords (BM25). Returns the ids, titles and first "
                f"{f'{self.snippet_tokens} tokens' if self.snippet_tokens else 'words'} of the "
                f"best {self.k} documents.",
                {"query": {"type": "string", "description": "Keywords to search for."}},
            ),
            tool_schema(
                "open",
                "Open a document by its id and read its full text"
                + (f" (at most {self.document_tokens} tokens)." if self.document_tokens else "."),
                {"doc_id": {"type": "string", "description": "A document id from search."}},
            ),
        ]

    def handlers(self) -> dict[str, Any]:
        return {"search": self.tool_search, "open": self.tool_open}
