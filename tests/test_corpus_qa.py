"""corpus_qa: BrowseComp-Plus and generic JSONL inputs, evidence, and bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acmrl.envs import EnvError, load

FIXTURES = Path(__file__).parent / "fixtures" / "corpus_qa"
BC = {
    "queries": FIXTURES / "browsecomp_queries.jsonl",
    "corpus": FIXTURES / "browsecomp_corpus.jsonl",
}
GEN = {"queries": FIXTURES / "qa.jsonl", "corpus": FIXTURES / "corpus.jsonl"}


def all_tasks(env):
    return [t for split in env.splits for t in env.tasks(split)]


def play(env, task) -> tuple[float, list[str]]:
    session = env.session(task)
    observations = [session.call(name, args) for name, args in env.oracle_plan(task)]
    return session.score(), observations


def test_browsecomp_plus_queries():
    env = load("corpus_qa", **BC, eval_frac=1.0)
    tasks = env.tasks("eval")
    assert [t.id for t in tasks] == [f"corpus_qa/{i}" for i in (1, 2, 3, 4)]
    assert env.tasks("train") == []
    gold = {t.id: t.metadata["gold_docs"] for t in tasks}
    assert gold["corpus_qa/1"] == ["doc-104", "doc-105", "doc-106"]  # gold_docs over evidence_docs
    assert gold["corpus_qa/3"] == ["doc-102"]  # plain ids work as well as objects
    assert gold["corpus_qa/4"] == ["doc-104", "doc-108"]  # doc-999 is not in the corpus
    assert env.report == {"queries": 4, "missing_gold_docs": 1, "without_evidence": 0}
    for task in tasks:
        score, obs = play(env, task)
        assert score == 1.0
        assert all(f"[{d}]" in "\n".join(obs) for d in task.metadata["gold_docs"])
    opened = env.session(tasks[0]).call("open", {"doc_id": "doc-106"})
    assert (
        opened.startswith("[doc-106] Ledmere is a market town")
        and "https://example.org/ledmere" in opened
    )


def test_generic_jsonl_derives_evidence_and_accepts_alternatives():
    env = load("corpus_qa", **GEN, eval_frac=0.5)
    tasks = {t.id: t for t in all_tasks(env)}
    assert len(tasks) == 5 and env.report["without_evidence"] == 0
    assert tasks["corpus_qa/q3"].metadata["gold_docs"] == ["w5"]  # the doc that says "calcite"
    assert tasks["corpus_qa/q3"].metadata["gold_derived"] is True
    for task in tasks.values():
        assert play(env, task)[0] == 1.0
    marble = tasks["corpus_qa/q2"]
    assert env.score(marble, "Marble stone") == 1.0 and env.score(marble, "granite") == 0.0
    f1 = load("corpus_qa", **GEN, metric="f1")
    assert f1.score(marble, "white marble") == pytest.approx(2 / 3)


def test_splits_are_stable_and_disjoint():
    a = load("corpus_qa", **GEN, eval_frac=0.5)
    b = load("corpus_qa", **GEN, eval_frac=0.5)
    assert [t.id for t in a.tasks("eval")] == [t.id for t in b.tasks("eval")]
    assert not {t.id for t in a.tasks("eval")} & {t.id for t in a.tasks("train")}


def write(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_bad_files_name_file_line_and_field(tmp_path):
    corpus = write(tmp_path / "corpus.jsonl", [{"docid": "a", "text": "alpha"}])
    q = tmp_path / "q.jsonl"
    write(q, [{"query_id": "1", "query": "x", "answer": "y"}, {"query_id": "2", "query": "x"}])
    with pytest.raises(
        EnvError, match=r"q\.jsonl:2: missing field\(s\) \['answer'\].*query_id, query, answer"
    ):
        load("corpus_qa", queries=q, corpus=corpus)
    write(q, [{"id": "1", "answer": "y"}])
    with pytest.raises(EnvError, match=r"q\.jsonl:1: missing field\(s\) \['question'\]"):
        load("corpus_qa", queries=q, corpus=corpus)
    write(q, [{"id": "1", "question": "x", "answer": "y"}, '{"id": "2", "question": '])
    with pytest.raises(EnvError, match=r"q\.jsonl:2: not valid JSON"):
        load("corpus_qa", queries=q, corpus=corpus)
    write(
        q,
        [{"id": "1", "question": "x", "answer": "y"}, {"id": "1", "question": "z", "answer": "w"}],
    )
    with pytest.raises(EnvError, match="query id 'corpus_qa/1' occurs more than once"):
        load("corpus_qa", queries=q, corpus=corpus)
    write(q, ["[1, 2]"])
    with pytest.raises(EnvError, match="each row must be a JSON object, got int"):
        load("corpus_qa", queries=q, corpus=corpus)
    bad_corpus = write(
        tmp_path / "c2.jsonl", [{"docid": "a", "text": "alpha"}, {"docid": "b", "url": "u"}]
    )
    with pytest.raises(
        EnvError, match=r"c2\.jsonl:2: missing field\(s\) \['text'\]; a corpus document"
    ):
        load("corpus_qa", queries=q, corpus=bad_corpus)
    dup = write(tmp_path / "c3.jsonl", [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
    with pytest.raises(EnvError, match="document id 'a' occurs more than once"):
        load("corpus_qa", queries=q, corpus=dup)
    with pytest.raises(EnvError, match="no such file"):
        load("corpus_qa", queries=tmp_path / "missing.jsonl", corpus=corpus)
    with pytest.raises(EnvError, match="format='csv'"):
        load("corpus_qa", queries=q, corpus=corpus, format="csv")


def test_json_list_and_parquet_inputs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in GEN["corpus"].read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "corpus.parquet")
    (tmp_path / "qa.json").write_text(
        json.dumps([json.loads(x) for x in GEN["queries"].read_text().splitlines()])
    )
    env = load("corpus_qa", queries=tmp_path / "qa.json", corpus=tmp_path / "corpus.parquet")
    assert len(all_tasks(env)) == 5 and len(env.documents) == 6
    assert all(play(env, t)[0] == 1.0 for t in all_tasks(env))
