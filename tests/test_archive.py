import json
import stat

import pytest

from acmrl.context.archive import Archive, ArchiveError
from acmrl.context.state import assistant, function_call, function_call_output, user

ITEMS = [
    user("q"),
    function_call("c1", "search", {"query": "x"}),
    function_call_output("c1", "raw result " * 10),
    assistant("thinking"),
]


def test_round_trip_and_fresh_ids(tmp_path):
    with Archive(tmp_path / "a") as arc:
        s1 = arc.put(ITEMS[:2], summary="first")
        s2 = arc.put(ITEMS[2:])
        assert (s1, s2) == ("S1", "S2")
        assert arc.get(s1) == ITEMS[:2] and arc.get(s2) == ITEMS[2:]
        assert arc.record(s1)["summary"] == "first"
        assert arc.ids() == ["S1", "S2"] and s1 in arc and len(arc) == 2


def test_unknown_id_lists_valid_ids(tmp_path):
    with Archive(tmp_path / "a") as arc:
        with pytest.raises(ArchiveError, match=r"unknown summary id 'S1'; valid ids: none yet"):
            arc.get("S1")
        arc.put(ITEMS)
        with pytest.raises(ArchiveError, match=r"unknown summary id 'S9'; valid ids: S1"):
            arc.get("S9")


def test_tampering_is_detected(tmp_path):
    with Archive(tmp_path / "a") as arc:
        sid = arc.put(ITEMS)
        path = arc.path / f"{sid}.json"
        record = json.loads(path.read_text())
        record["items"][0]["content"][0]["text"] = "changed"
        path.write_text(json.dumps(record))
        with pytest.raises(ArchiveError, match="failed its checksum"):
            arc.get(sid)
        path.write_text("{ truncated")
        with pytest.raises(ArchiveError, match="unreadable"):
            arc.get(sid)


def test_permissions_are_private(tmp_path):
    with Archive(tmp_path / "a") as arc:
        sid = arc.put(ITEMS)
        assert stat.S_IMODE(arc.path.stat().st_mode) == 0o700
        assert stat.S_IMODE((arc.path / f"{sid}.json").stat().st_mode) == 0o600
        assert [p.name for p in arc.path.iterdir()] == [f"{sid}.json"]  # no temp files left


def test_close_deletes_unless_kept(tmp_path):
    arc = Archive()
    arc.put(ITEMS)
    path = arc.path
    arc.close()
    assert not path.exists()
    with pytest.raises(ArchiveError, match="closed"):
        arc.get("S1")
    kept = Archive(tmp_path / "kept", keep=True)
    kept.put(ITEMS)
    kept.close()
    assert (tmp_path / "kept" / "S1.json").is_file()


def test_size_cap_and_ids_never_reused(tmp_path):
    with Archive(tmp_path / "a", max_bytes=1500) as arc:
        arc.put(ITEMS[:1])
        with pytest.raises(ArchiveError, match="archive is full"):
            arc.put([function_call_output("c1", "x" * 5000)])
        assert arc.put(ITEMS[:1]) == "S3"  # S2 was consumed by the refused write
        assert arc.ids() == ["S1", "S3"]


def test_rejects_non_json_items(tmp_path):
    with Archive(tmp_path / "a") as arc, pytest.raises(ValueError):
        arc.put([{"type": "message", "content": {1, 2}}])
