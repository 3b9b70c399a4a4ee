"""acmrl audit: the ceilings of a task set, measured through the real agent loop.

On ``kb_search chain`` no trivial strategy may score (the test the benchmark is held to), the
react ceiling stays low for a structural reason (three long documents do not fit the budget), and
the managing arms reach every answer, ``acm`` through its archive on the recall questions, and
observation masking once the policy's thoughts repeat what it read. On
``tiny`` the same audit exposes the shortcut that makes it a smoke test: a title in a search
listing is the answer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from acmrl.config import AuditConfig
from acmrl.envs import load
from acmrl.eval.audit import run_audit
from acmrl.teacher.ceiling import extract


def _audit(tmp_path, default_model_dir, preset, limit, **agent):
    cfg = AuditConfig(output=str(tmp_path / preset))
    cfg.model.name = str(default_model_dir)
    cfg.env.options = {"preset": preset, "seed": 0}
    cfg.env.limit = limit
    for key, value in agent.items():
        setattr(cfg.agent, key, value)
    report = run_audit(cfg)
    return {(r["strategy"], r["arm"]): r for r in report["strategies"]}, report


def test_chain_admits_no_trivial_answer_and_needs_context_management(tmp_path, default_model_dir):
    rows, report = _audit(tmp_path, default_model_dir, "chain", 20)
    assert report["on_overflow"] == "force_answer" and report["tasks"] == 20
    for name in ("first_result", "listed_title", "frequent", "random"):
        assert rows[(name, "react")]["pass@1"] <= 0.10, (name, rows[(name, "react")])
    assert rows[("ceiling", "react")]["pass@1"] <= 0.40
    assert rows[("ceiling", "react")]["overflow"] >= 0.9  # the third document never fits
    # nor when react's thoughts repeat every evidence line read so far
    assert rows[("noted", "react")]["pass@1"] <= 0.40
    for arm in ("acm", "summary"):
        assert rows[("ceiling", arm)]["pass@1"] >= 0.90, arm
    # observation masking (the harness masks the oldest results) needs the policy's own notes:
    # masked, the first document's fact is gone; repeated in each thought, it survives
    assert rows[("ceiling", "mask")]["pass@1"] <= 0.40
    assert rows[("noted", "mask")]["pass@1"] >= 0.90
    assert rows[("noted", "mask")]["compactions"] > 0
    # acm reads the membership back from its archive on exactly the recall questions (6 of 20)
    assert rows[("ceiling", "acm")]["query_memory"] == pytest.approx(6 / 20)
    assert rows[("ceiling", "summary")]["query_memory"] == 0
    # the react ceiling never answers what its context does not show: at the overflow it has
    # lost the first document, and says so
    for line in (tmp_path / "chain" / "episodes.jsonl").read_text().splitlines():
        ep = json.loads(line)
        if ep["episode_id"].endswith("#react#ceiling"):
            last = [a for s in ep["steps"] for a in s["actions"]][-1]
            assert last == {"name": "answer", "arguments": {"text": "unknown"}}, ep["episode_id"]
    md = (tmp_path / "chain" / "audit.md").read_text()
    report = json.loads((tmp_path / "chain" / "audit.json").read_text())
    assert "| ceiling | acm | 1.000" in md and report["strategies"]
    assert f"Report written by acmrl {report['code']['acmrl']}" in md  # and its commit, if any


def test_tiny_shows_its_shortcut(tmp_path, default_model_dir):
    rows, _ = _audit(tmp_path, default_model_dir, "tiny", 8, max_context_tokens=1300)
    # a react agent that answers from the listing of "<town> <year>" needs no context tool
    assert rows[("ceiling", "react")]["pass@1"] == 1.0
    assert rows[("listed_title", "react")]["pass@1"] == 1.0
    assert rows[("ceiling", "react")]["compactions"] == 0


def test_an_audit_resumes_from_its_episodes(tmp_path, default_model_dir):
    _, first = _audit(tmp_path, default_model_dir, "tiny", 2, max_context_tokens=1300)
    path = tmp_path / "tiny" / "episodes.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-3]) + "\n")  # as if killed three episodes early
    _, again = _audit(tmp_path, default_model_dir, "tiny", 2, max_context_tokens=1300)
    assert len(path.read_text().splitlines()) == len(lines)
    assert again["strategies"] == first["strategies"]


def test_an_audit_refuses_episodes_of_other_settings(tmp_path, default_model_dir):
    _audit(tmp_path, default_model_dir, "tiny", 1, max_context_tokens=1300)
    with pytest.raises(ValueError, match=r"agent.max_context_tokens: 1300 -> 3000"):
        _audit(tmp_path, default_model_dir, "tiny", 1, max_context_tokens=3000)


def test_the_ceiling_answers_only_from_evidence_in_view():
    """A ledger question's evidence is the birth sentence and the ledger line, each from its own
    document; the recall question's membership can be asked of the archive."""
    env = load("kb_search", preset="chain", seed=0)
    ledger = next(t for t in env.tasks("eval") if t.metadata["question"] == "ledger")
    recall = next(t for t in env.tasks("eval") if t.metadata["question"] == "recall")
    born, line = env.answer_evidence(ledger)
    assert " was born in " in born.text and ledger.answer in line.text
    assert line.selector in born.text and born.doc_id != line.doc_id
    lodge, member = env.answer_evidence(recall)
    assert member.selector in lodge.text and recall.answer in member.text and member.query
    head = f"Archived steps S1:\nresult: {member.text} X holds member number 1 in the Y Guild."
    assert extract(f"{head}\n\nQuestion: {member.query}\n\nAnswer with only") == member.text


def test_a_mixture_routes_each_task_to_its_worlds_evidence():
    """Every method a ceiling reads is routed: a mixture of chain worlds must not fall back to
    'the answer in view', which would let react answer a recall question from the list."""
    mix = load("mixture", env="kb_search", seeds=[1, 2], options={"preset": "chain"})
    world = load("kb_search", preset="chain", seed=2)
    task = world.tasks("train")[3]
    assert mix.answer_evidence(task) == world.answer_evidence(task)
    assert len(mix.answer_evidence(task)) == 2


def test_a_ceiling_never_answers_what_its_context_does_not_show(tmp_path, default_model_dir):
    """code_nav names no evidence of its own (the default: the answer itself): a ceiling that
    succeeds had the answer in its last prompt, and one whose summary dropped it reads again or
    says it does not know, never the expert's answer from memory."""
    from acmrl.models import load_tokenizer

    cfg = AuditConfig(output=str(tmp_path / "code_nav"), arms=["react", "summary"], trivial=[])
    cfg.model.name = str(default_model_dir)
    cfg.env.name, cfg.env.options, cfg.env.limit = "code_nav", {}, 30
    cfg.agent.max_context_tokens = 1000
    run_audit(cfg)
    tok = load_tokenizer(str(default_model_dir))
    env = load("code_nav")
    tasks = {t.id: t for t in env.tasks("eval")}
    wins = 0
    for line in (tmp_path / "code_nav" / "episodes.jsonl").read_text().splitlines():
        ep = json.loads(line)
        if ep["score"] < 1.0:
            continue
        wins += 1
        last = [s["call"] for s in ep["steps"] if s.get("call")][-1]
        shown = tok.decode(last["prompt_ids"])
        evidence = env.answer_evidence(tasks[ep["task_id"]])
        assert all(e.text in shown for e in evidence), ep["episode_id"]
    assert wins >= 20


def test_audit_cli_rejects_an_unknown_strategy(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "acmrl.cli", "audit", "trivial=[oracle]", f"output={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "trivial: unknown strategies ['oracle']" in res.stderr


def test_an_audit_reports_each_arms_fixed_prompt(tmp_path, default_model_dir):
    _, full = _audit(tmp_path / "a", default_model_dir, "tiny", 1, max_context_tokens=1300)
    _, brief = _audit(
        tmp_path / "b", default_model_dir, "tiny", 1, max_context_tokens=1300, evolve_prompt="brief"
    )
    fixed = full["fixed_prompt_tokens"]
    assert list(fixed) == ["react", "summary", "memory", "acm", "evolve", "mask"]
    assert fixed["react"] == fixed["summary"] < fixed["memory"] < fixed["acm"] < fixed["evolve"]
    assert fixed["mask"] == fixed["react"]
    assert brief["fixed_prompt_tokens"]["evolve"] < fixed["evolve"]
    assert brief["fixed_prompt_tokens"]["acm"] == fixed["acm"]
    md = (tmp_path / "a" / "tiny" / "audit.md").read_text()
    assert f"evolve {fixed['evolve']:,}, mask {fixed['mask']:,}." in md


def test_an_audit_folder_from_before_an_agent_option_existed_resumes(tmp_path, default_model_dir):
    _audit(tmp_path, default_model_dir, "tiny", 1, max_context_tokens=1300)
    path = tmp_path / "tiny" / "audit-settings.json"
    saved = json.loads(path.read_text())
    del saved["agent"]["evolve_prompt"]  # as written before the option existed
    path.write_text(json.dumps(saved))
    _audit(tmp_path, default_model_dir, "tiny", 1, max_context_tokens=1300)  # its default then
    with pytest.raises(ValueError, match=r"agent.evolve_prompt: 'full' -> 'none'"):
        _audit(
            tmp_path, default_model_dir, "tiny", 1, max_context_tokens=1300, evolve_prompt="none"
        )
