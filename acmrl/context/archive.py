"""The per-episode archive behind ``manage_context`` and ``query_memory`` (the ACM
write-up, docs/design.md).

``manage_context`` replaces raw State items with a summary and stores the raw items here under a
fresh summary id; ``query_memory(summary_id, query)`` reads them back for the querier. The id
mapping is the only thing that makes the compression lossless, so it is guarded:

- ids are never reused within an episode, even after ``close()``;
- each record carries a SHA-256 of its items, verified on every read;
- a wrong or unknown id raises :class:`ArchiveError` naming the valid ids;
- records are written atomically (temporary file + rename), readable only by the user
  (directory 0700, files 0600), because the archive is a verbatim copy of what the agent saw;
- a size cap bounds the episode's archive;
- ``close()`` deletes the directory unless the archive was opened with ``keep=True``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from acmrl.context.state import Item, check_json

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class ArchiveError(ValueError):
    """An archive id is unknown, a record is corrupt, or the archive is full or closed."""


def _digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def _encode(items: list[Item]) -> bytes:
    return json.dumps(items, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()


class Archive:
    """Summary id -> the raw State items that summary replaced, for one episode."""

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        keep: bool = False,
        max_bytes: int = DEFAULT_MAX_BYTES,
        prefix: str = "S",
    ):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        if root is None:
            self.path = Path(tempfile.mkdtemp(prefix="acmrl-archive-"))  # created 0700
        else:
            self.path = Path(root)
            self.path.mkdir(parents=True, exist_ok=False)
        os.chmod(self.path, 0o700)
        self.keep, self.max_bytes, self.prefix = keep, max_bytes, prefix
        self._next = 1
        self._bytes = 0
        self._ids: list[str] = []
        self._closed = False

    # -- writing ----------------------------------------------------------------------------

    def put(self, items: list[Item], summary: str | None = None) -> str:
        """Store ``items`` under a fresh id and return it."""
        self._check_open()
        check_json(items)
        summary_id = f"{self.prefix}{self._next}"
        self._next += 1  # consumed even if the write fails: ids are never reused
        payload = _encode(items)
        record = {"id": summary_id, "sha256": _digest(payload), "summary": summary, "items": items}
        data = json.dumps(record, ensure_ascii=False).encode()
        if self._bytes + len(data) > self.max_bytes:
            raise ArchiveError(
                f"archive is full: storing {summary_id} ({len(data):,} bytes) would exceed the "
                f"cap of {self.max_bytes:,} bytes ({self._bytes:,} used)"
            )
        self._write_atomic(self._file(summary_id), data)
        self._bytes += len(data)
        self._ids.append(summary_id)
        return summary_id

    def _write_atomic(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-")  # mkstemp creates 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    # -- reading ----------------------------------------------------------------------------

    def get(self, summary_id: str) -> list[Item]:
        """The raw items stored under ``summary_id``, checksum verified."""
        return self.record(summary_id)["items"]

    def record(self, summary_id: str) -> dict[str, Any]:
        self._check_open()
        if summary_id not in self._ids:
            valid = ", ".join(self._ids) if self._ids else "none yet"
            raise ArchiveError(f"unknown summary id {summary_id!r}; valid ids: {valid}")
        path = self._file(summary_id)
        try:
            record = json.loads(path.read_bytes())
        except (OSError, json.JSONDecodeError) as exc:
            raise ArchiveError(f"archive record {summary_id!r} is unreadable: {exc}") from None
        if record.get("id") != summary_id or _digest(_encode(record.get("items"))) != record.get(
            "sha256"
        ):
            raise ArchiveError(f"archive record {summary_id!r} failed its checksum; it was altered")
        return record

    def ids(self) -> list[str]:
        return list(self._ids)

    def __contains__(self, summary_id: object) -> bool:
        return summary_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """End the episode: delete the directory unless ``keep``. Further use raises."""
        if self._closed:
            return
        self._closed = True
        if not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ArchiveError(f"archive {self.path} is closed")

    def _file(self, summary_id: str) -> Path:
        return self.path / f"{summary_id}.json"
