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


def _fanout(tmp_path, rows):
    corpus = tmp_path / "corpus.jsonl"
    docs = [
        ("d1", "Lighthouses", "The Harwick lighthouse was designed by Mara Quell in 1871."),
        ("d2", "Bridges", "The Oldport bridge was designed by Tomas Brecht in 1902."),
        ("d3", "Towers", "The Vell clock tower was designed by Ines Roan in 1888."),
        ("d4", "Halls", "The Greymoor market hall was designed by Piet Aldous in 1911."),
        ("d5", "Misc", "Nothing about designers here at all."),
    ]
    corpus.write_text("\n".join(json.dumps({"id": i, "title": t, "text": x}) for i, t, x in docs))
    queries = tmp_path / "q.jsonl"
    queries.write_text("\n".join(json.dumps(r) for r in rows))
    return {"queries": queries, "corpus": corpus, "eval_frac": 0.0}


FOUR = {
    "id": "fan1",
    "question": "Who designed the Harwick lighthouse, the Oldport bridge, the Vell clock tower "
    "and the Greymoor market hall?",
    "answers": ["Mara Quell", ["Tomas Brecht", "T. Brecht"], "Ines Roan", "Piet Aldous"],
    "answer_set": True,
    "aliases": {"Mara Quell": ["M. Quell"]},
}


def test_answer_sets_need_every_part(tmp_path):
    """A four-part question with one right part is not a success."""
    env = load("corpus_qa", **_fanout(tmp_path, [FOUR]))
    (task,) = env.tasks("train")
    assert task.answer == ["Mara Quell", "Tomas Brecht", "Ines Roan", "Piet Aldous"]
    assert task.metadata["answer_set"] is True
    assert task.metadata["aliases"] == {"Mara Quell": ["M. Quell"], "Tomas Brecht": ["T. Brecht"]}
    one = env.score(task, "Mara Quell")
    assert one == pytest.approx(0.4)  # set F1: precision 1, recall 1/4 (documented partial credit)
    assert one < 1.0  # not a success
    assert env.score(task, "Ines Roan, Oldport") == pytest.approx(1 / 3)  # a wrong part costs
    assert env.score(task, "Mara Quell, Tomas Brecht, Ines Roan and Piet Aldous") == 1.0
    assert env.score(task, "M. Quell; T. Brecht; Ines Roan; Piet Aldous") == 1.0  # aliases
    assert env.score(task, "Mara Quell, M. Quell, Ines Roan, Piet Aldous") < 1.0  # one item twice
    # the oracle finds one evidence document per part and answers with all of them
    assert sorted(task.metadata["gold_docs"]) == ["d1", "d2", "d3", "d4"]
    assert play(env, task)[0] == 1.0


def test_single_answers_take_aliases_and_lists_stay_alternatives(tmp_path):
    rows = [
        {
            "id": "a",
            "question": "Who designed the Harwick lighthouse?",
            "answer": "Mara Quell",
            "aliases": ["M. Quell"],
        },
        {
            "id": "b",
            "question": "Who designed the Oldport bridge?",
            "answer": ["Tomas Brecht", "T. Brecht"],
        },
    ]
    env = load("corpus_qa", **_fanout(tmp_path, rows))
    a, b = sorted(env.tasks("train"), key=lambda t: t.id)
    assert env.score(a, "M. Quell") == 1.0 and env.score(a, "Ines Roan") == 0.0
    assert env.score(b, "T. Brecht") == 1.0  # a plain list is still "any one of"
    assert "answer_set" not in b.metadata


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"answer": "x", "answer_set": True}, "non-empty list"),
        ({"answer": ["x"], "answer_set": "yes"}, "true or false"),
        ({"answer": ["x", "y"], "answer_set": True, "aliases": {"z": ["w"]}}, "not one of"),
        ({"answer": ["x", "y"], "answer_set": True, "aliases": [["a"]]}, "aliases must be"),
        ({"answer": ["x", []], "answer_set": True}, "non-empty list of strings"),
        ({"answer": {"x": 1}}, "must be a string"),
    ],
)
def test_bad_answer_fields_are_named(tmp_path, row, message):
    rows = [{"id": "bad", "question": "Who designed it?", **row}]
    with pytest.raises(EnvError, match=message) as err:
        load("corpus_qa", **_fanout(tmp_path, rows))
    assert "q.jsonl:1" in str(err.value)


def test_browsecomp_plus_preset_settings(tmp_path, default_model_dir):
    """The reference's settings: top 10, snippets of 512 tokens, open cut at 8,192 tokens, the
    query_memory line, and the judge metric, which needs a judge (metric=em is the fallback)."""
    from acmrl.models import load_tokenizer

    long_text = " ".join(f"word{i}" for i in range(6000))  # ~ 18k tokens
    corpus = [{"docid": f"d{i}", "text": f"Ledmere fact {i}. {long_text}"} for i in range(12)]
    queries = [{"query_id": "q1", "query": "Ledmere fact", "answer": "x", "gold_docs": ["d0"]}]
    paths = {
        "queries": write(tmp_path / "q.jsonl", queries),
        "corpus": write(tmp_path / "c.jsonl", corpus),
    }
    with pytest.raises(EnvError, match=r"metric=judge .* env\.judge\.model"):
        load("corpus_qa", **paths, preset="browsecomp-plus")
    with pytest.raises(EnvError, match="preset='bcp' is not known"):
        load("corpus_qa", **paths, preset="bcp")
    env = load("corpus_qa", **paths, preset="browsecomp-plus", metric="em", eval_frac=1.0)
    assert env.settings == {
        "search_k": 10,
        "snippet_tokens": 512,
        "document_tokens": 8192,
        "memory_hint": True,
        "metric": "em",
    }
    (task,) = env.tasks("eval")
    assert "query_memory retrieves them by id" in task.prompt
    tools = {t["function"]["name"]: t["function"]["description"] for t in env.tools()}
    assert "first 512 tokens of the best 10 documents" in tools["search"]
    assert "at most 8192 tokens" in tools["open"]
    tok = load_tokenizer(str(default_model_dir))
    session = env.session(task)
    hits = session.call("search", {"query": "Ledmere fact"}).split("\n")[1:]
    assert len(hits) == 10
    snippet = hits[0].split(": ", 1)[1]
    assert snippet.endswith(" ...")
    assert 505 <= len(tok.encode(snippet[: -len(" ...")], add_special_tokens=False)) <= 520
    opened = session.call("open", {"doc_id": "d3"})
    body, note = opened.rsplit("\n", 1)
    assert note.startswith("[document cut: its first 8192 of ") and note.endswith(" tokens]")
    text = body.split("\n\n", 1)[1]  # after the id and title
    assert 8185 <= len(tok.encode(text, add_special_tokens=False)) <= 8200
    # without the preset: 5 results of 20 words, whole documents, no hint, exact match
    plain = load("corpus_qa", **paths, eval_frac=1.0)
    (ptask,) = plain.tasks("eval")
    assert "query_memory" not in ptask.prompt and plain.metric == "em"
    assert len(plain.session(ptask).call("open", {"doc_id": "d3"})) > len(opened)


def stand_in_judge(monkeypatch, verdict) -> list[str]:
    """Replace the LLM judge's verdict by ``verdict(response, reference)`` on the real judge
    prompts, as a capable judge would decide; the judge's engine still answers each prompt for
    real. Returns the prompts seen, as they come."""
    from acmrl.rollout import judge as judge_mod

    prompts: list[str] = []
    real = judge_mod.llm_judge

    def recording(complete, **kw):
        def decide(prompt: str) -> str:
            prompts.append(prompt)
            assert isinstance(complete(prompt), str)  # the engine still answers for real
            said = prompt.split("Response:")[1].split("\n")[0]
            ref = prompt.split("Reference answer:")[1].split("\n")[0]
            return verdict(said, ref)

        return real(decide, **kw)

    monkeypatch.setattr(judge_mod, "llm_judge", recording)
    return prompts


def test_the_judge_metric_scores_through_env_judge(tiny_model_dir, monkeypatch):
    """env.judge.model builds an LLM judge on an engine (here the tiny model under transformers
    in this process) and every environment built from a config scores with it. A random model
    cannot write a verdict, so the run without a stand-in ends with the judge's error, naming
    the reply; the stand-in then decides as a capable judge would, on the same prompts."""
    from acmrl.config import EnvConfig
    from acmrl.envs.scoring import JudgeError
    from acmrl.rollout.environment import build_environment

    opts = {**{k: str(v) for k, v in GEN.items()}, "metric": "judge"}
    cfg = EnvConfig(name="corpus_qa", options=opts)
    cfg.judge.model = str(tiny_model_dir)
    env = build_environment(cfg)
    task = all_tasks(env)[0]
    with pytest.raises(JudgeError, match="holds no verdict"):
        env.score(task, "Paris")

    prompts = stand_in_judge(
        monkeypatch,
        lambda said, ref: '{"verdict": "correct"}' if ref.strip() in said else "incorrect",
    )
    env = build_environment(cfg)
    ref = task.answer if isinstance(task.answer, str) else task.answer[0]
    assert env.score(task, f"It is {ref}.") == 1.0 and env.score(task, "no idea") == 0.0
    assert len(prompts) == 2 and task.metadata["question"] in prompts[0]
