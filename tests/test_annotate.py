"""acmrl annotate: the LLM teacher's JSON handling, the dataset, shards, resume after a kill."""

from __future__ import annotations

import json

import pytest
import torch

from acmrl.config import AgentConfig, AnnotateConfig, SamplingConfig
from acmrl.context.render import format_tool_call
from acmrl.engines.scripted import ScriptedEngine
from acmrl.envs import load
from acmrl.teacher.annotate import run_annotate
from acmrl.teacher.llm import LLMTeacher, parse_json_object


@pytest.fixture(scope="module")
def tiny(tiny_engine):
    return tiny_engine


def student(tok):
    """A student that opens with a search, then answers too early: canonical text, so its tokens
    re-tokenise exactly; the resumed runs reuse it."""

    def reply(session_id: str, prompt: str) -> str:
        if prompt.count("<tool_response>") == 0 and "#edit" not in session_id:
            return "I think it is the Amber Kite Fair."
        return format_tool_call("answer", {"text": "Amber Kite Fair"})

    return ScriptedEngine(tok, reply)


def config(tmp_path, **kw) -> AnnotateConfig:
    cfg = AnnotateConfig(output=str(tmp_path / "ann"), resumes=2, **kw)
    cfg.env.options = {"preset": "tiny", "seed": 0}
    cfg.env.split = "train"
    cfg.env.limit = 4
    cfg.agent.max_turns = 4
    cfg.sampling.max_new_tokens = 32
    return cfg


def test_parse_json_object_is_robust():
    assert parse_json_object('Sure!\n```json\n{"kind": "no_action"}\n```') == {"kind": "no_action"}
    assert parse_json_object('Here: {"a": "x}y", "b": {"c": 1}} and more {"d": 2}') == {
        "a": "x}y",
        "b": {"c": 1},
    }
    with pytest.raises(ValueError, match="no JSON object"):
        parse_json_object("{not json} nor this")


def _student_episode(tiny, arm: str):
    """One finished episode of the scripted student on the first tiny eval task."""
    from acmrl.rollout.agent import Episode
    from acmrl.rollout.worker import run_episodes

    env = load("kb_search", preset="tiny", seed=0)
    task = env.tasks("eval")[0]
    ep = Episode(
        "e",
        env,
        task,
        arm,
        tiny.tokenizer,
        agent=AgentConfig(),
        sampling=SamplingConfig(max_new_tokens=16),
    )
    run_episodes([ep], student(tiny.tokenizer))
    return task, ep


def _teacher_run(tiny, replies: list[str], attempts: int = 3):
    task, ep = _student_episode(tiny, "acm")
    queue = list(replies)
    teacher = LLMTeacher(
        ScriptedEngine(tiny.tokenizer, lambda s, p: queue.pop(0) if queue else "no"),
        tiny.tokenizer,
        max_attempts=attempts,
    )
    return teacher.assess(task, ep.traj, ep.budget, ep.tools), task


def test_llm_teacher_retries_then_accepts(tiny):
    good = {
        "kind": "correction",
        "step": 0,
        "action": {"name": "search", "arguments": {"query": "who"}},
        "rationale": "I have not looked anything up yet, so I should search before I answer.",
    }
    a, _ = _teacher_run(tiny, ["I think the agent was wrong.", f"```json\n{json.dumps(good)}\n```"])
    assert a.valid and a.attempts == 2 and a.kind == "correction" and a.action == good["action"]


def test_llm_teacher_records_a_failure_after_its_attempts(tiny):
    _, task = _teacher_run(tiny, [])
    leak = {
        "kind": "correction",
        "step": 0,
        "action": {"name": "search", "arguments": {"query": "x"}},
        "rationale": f"The feedback says the answer is {task.answer}, so I should look it up now.",
    }
    a, _ = _teacher_run(tiny, [json.dumps(leak)] * 3)
    assert not a.valid and a.attempts == 3
    assert any("leaks the reference answer" in e for e in a.errors)
    assert any("mentions 'feedback'" in e for e in a.errors)


def test_llm_teacher_evolve_code_must_run(tiny):
    """An LLM teacher's evolve edit is run in the sandbox on the student's State:
    code that fails there is sent back with the error, and the retry is accepted."""
    from acmrl.teacher.splice import state_before

    task, ep = _student_episode(tiny, "evolve")
    env = ep.env

    def edit(code):
        return json.dumps(
            {
                "kind": "injection",
                "step": 0,
                "action": {"name": "evolve", "arguments": {"code": code}},
                "rationale": "My memory holds nothing I need yet, so I will keep it as it is now.",
            }
        )

    queue = [edit("throw new Error('broken edit');"), edit("return state;")]
    prompts = []

    def reply(session, prompt):
        prompts.append(prompt)
        return queue.pop(0)

    teacher = LLMTeacher(ScriptedEngine(tiny.tokenizer, reply), tiny.tokenizer, max_attempts=3)

    def state_at(step):
        return state_before(
            env,
            task,
            ep.traj,
            step,
            tiny.tokenizer,
            agent=AgentConfig(),
            sampling=SamplingConfig(max_new_tokens=16),
        )

    a = teacher.assess(task, ep.traj, ep.budget, ep.tools, state_at)
    assert a.valid and a.attempts == 2 and a.action["arguments"]["code"] == "return state;"
    assert "evolve code fails" in prompts[1] and "broken edit" in prompts[1]


def test_llm_teacher_with_a_real_model_fails_cleanly(tiny):
    """The tiny random model cannot write JSON unconstrained: the assessment is recorded as
    failed. With the reply's schema as response_format (the default), every reply parses and
    only the validators can refuse it."""
    task, ep = _student_episode(tiny, "react")
    a = LLMTeacher(tiny, tiny.tokenizer, max_attempts=2, max_tokens=24, structured=False).assess(
        task, ep.traj, ep.budget, ep.tools
    )
    assert not a.valid and a.attempts == 2
    assert a.errors == [
        "the reply holds no JSON object",
        "the reply was cut at 24 tokens: write a shorter one",
    ]
    seen = []

    class Recording:
        def generate(self, reqs):
            out = tiny.generate(reqs)
            seen.extend(c.text for c in out)
            return out

        def release(self, session_id):
            tiny.release(session_id)

    a = LLMTeacher(Recording(), tiny.tokenizer, max_attempts=2, max_tokens=600).assess(
        task, ep.traj, ep.budget, ep.tools
    )
    assert a.valid or not any("JSON" in e or "kind must" in e for e in a.errors), a.errors
    objs = [json.loads(t) for t in seen]
    assert objs and all(
        o["kind"] in ("correction", "no_action") for o in objs
    )  # react: no injection


def test_annotate_builds_a_dataset_that_loads_and_retokenises(tiny, tmp_path, capsys):
    from datasets import load_from_disk

    cfg = config(tmp_path)
    stats = run_annotate(cfg, engine=student(tiny.tokenizer))
    # the progress line says what runs before a chunk's tasks end (a log, not a terminal here)
    assert "student runs: 8 episodes" in capsys.readouterr().out
    assert stats["student_trajectories"] == 8 and stats["edits"] == {"correction": 8}
    assert stats["resumed_runs"] == 16 and stats["teacher_tokens"] > 0
    ds = load_from_disk(f"{cfg.output}/dataset")
    assert ds["trajectories"].num_rows == 24
    tok = tiny.tokenizer
    for s in ds["samples"]:
        ids = s["token_ids"]
        assert len(ids) == len(s["loss_mask"]) == len(s["origin"]) == len(s["old_logprobs"])
        assert (
            tok.encode(tok.decode(ids), add_special_tokens=False) == ids
        )  # exactly what was stored
        assert all(m == int(o != 0) for m, o in zip(s["loss_mask"], s["origin"], strict=True))
        assert s["weight"] == (
            1.0 if 2 in s["origin"] else 0.0
        )  # the scripted student always fails
    resumed = [t for t in ds["trajectories"] if t["role"] == "resumed"]
    assert all(t["edit_kind"] == "correction" and t["resumed_from"] for t in resumed)
    card = (tmp_path / "ann" / "README.md").read_text()
    assert "| resumed_runs | 16 |" in card
    assert (tmp_path / "ann" / "parquet" / "samples.parquet").exists()


def test_shards_combine_and_a_killed_shard_resumes(tiny, tmp_path):
    eng = student(tiny.tokenizer)
    run_annotate(config(tmp_path, shard="1/2"), engine=eng)

    class Kill(Exception):
        pass

    calls = []
    real = eng.generate

    def dying(requests):
        calls.append(1)
        if len(calls) == 3:
            raise Kill
        return real(requests)

    eng.generate = dying  # type: ignore[method-assign]
    cfg = config(tmp_path, shard="0/2", concurrency=2)
    with pytest.raises(Kill):
        run_annotate(cfg, engine=eng)
    eng.generate = real  # type: ignore[method-assign]
    stats = run_annotate(cfg, engine=eng)
    ids = [
        json.loads(line)["task_id"]
        for p in sorted((tmp_path / "ann").glob("records-*.jsonl"))
        for line in p.read_text().splitlines()
    ]
    assert len(ids) == 4 == len(set(ids))
    assert stats["student_trajectories"] == 8


def test_merge_builds_once_every_shard_is_complete(tiny, tmp_path):
    """A job array's shards record only (build_dataset=false); --merge refuses a shard that is
    short of tasks or records of another sharding, and ignores a line still being written."""
    from datasets import load_from_disk

    from acmrl.teacher.annotate import merge_shards

    eng = student(tiny.tokenizer)
    run_annotate(config(tmp_path, shard="0/2", build_dataset=False), engine=eng)
    assert not (tmp_path / "ann" / "dataset").exists()
    with pytest.raises(ValueError, match=r"shard 1/2 recorded 0 of 2 tasks"):
        merge_shards(config(tmp_path), 2)
    run_annotate(config(tmp_path, shard="1/2", build_dataset=False), engine=eng)
    with (tmp_path / "ann" / "records-1-of-2.jsonl").open("a") as f:
        f.write('{"task_id": "half-writt')  # a shard killed mid-line, or still writing
    stats = merge_shards(config(tmp_path), 2)
    assert stats["student_trajectories"] == 8
    assert len(set(load_from_disk(f"{tmp_path}/ann/dataset")["trajectories"]["task_id"])) == 4
    (tmp_path / "ann" / "records-0-of-1.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"records-0-of-1\.jsonl .* another sharding"):
        merge_shards(config(tmp_path), 2)


def test_teacher_topk_logprobs_on_the_compacted_view(tiny, tiny_model_dir, tmp_path):
    from datasets import load_from_disk

    cfg = config(tmp_path)
    cfg.env.limit = 1
    cfg.teacher.topk = 3
    cfg.teacher.topk_model = str(tiny_model_dir)
    run_annotate(cfg, engine=student(tiny.tokenizer))
    samples = load_from_disk(f"{cfg.output}/dataset")["samples"]
    model = tiny.model
    for s in samples:
        targets = [i for i, m in enumerate(s["loss_mask"]) if m]
        assert len(s["teacher_topk_ids"]) == len(targets) and all(
            len(t) == 3 for t in s["teacher_topk_ids"]
        )
        # the teacher read exactly the sample's ids: recompute one position by hand
        t = targets[-1]
        with torch.no_grad():
            logp = torch.log_softmax(
                model(torch.tensor([s["token_ids"][:t]])).logits[0, -1].float(), -1
            )
        top = logp.topk(3)
        assert s["teacher_topk_ids"][-1] == top.indices.tolist()
        assert s["teacher_topk_logprobs"][-1] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_demonstrations_are_whole_teacher_episodes(tokenizer):
    """Under a budget where ReAct overflows, the oracle's demonstrations with manage_context
    succeed; every policy turn is the teacher's, so every sample target is a teacher token."""
    from acmrl.teacher.demonstrate import demonstrate
    from acmrl.train.samples import ENV, TEACHER, trajectory_samples

    env = load("kb_search", preset="tiny", seed=0)
    tasks = env.tasks("train")[:6]
    agent = AgentConfig(max_turns=12, max_context_tokens=1250)
    demos = demonstrate(
        env,
        tasks,
        ["react", "acm"],
        tokenizer,
        agent=agent,
        sampling=SamplingConfig(),
        pressure=0.75,
    )
    acm = [d for d in demos if d.arm == "acm"]
    react = [d for d in demos if d.arm == "react"]
    assert len(acm) == len(react) == 6
    assert all(d.score == 1.0 and d.metrics["compactions"] >= 1 for d in acm)
    assert sum(d.status == "overflow" for d in react) >= 3  # the budget is tight without tools
    for d in demos:
        assert d.edit["kind"] == "demonstration"
        assert all(s.call.role == "teacher" for s in d.steps if s.call is not None)
        for s in trajectory_samples(d, helpers=True):
            # a failed demonstration (react overflowing) teaches nothing by default
            assert set(s.origin) <= {ENV, TEACHER} and s.weight == d.score
            assert s.loss_mask == [int(o == TEACHER) for o in s.origin]
    summaries = [c for d in acm for s in d.steps for c in s.helper_calls]
    assert summaries and all(c.role == "summariser" for c in summaries)


def test_annotate_with_demonstrations_adds_them_to_the_dataset(tiny, tmp_path):
    from datasets import load_from_disk

    cfg = config(tmp_path, demonstrations=True, student_tasks=1)
    cfg.env.limit = 2
    cfg.agent.max_context_tokens = 1400
    stats = run_annotate(cfg, engine=student(tiny.tokenizer))
    assert stats["demonstrations"] == 4  # 2 tasks x 2 arms
    assert stats["student_trajectories"] == 2  # the student ran on the first task only
    rows = load_from_disk(f"{cfg.output}/dataset")["trajectories"]
    assert sum(r == "demonstration" for r in rows["role"]) == 4


def test_the_solve_filter_drops_tasks_solved_in_every_resume(tiny, tmp_path):
    """The reference's solve-count filter: a task whose every resume succeeds keeps nothing but
    its demonstrations; the other tasks are untouched. Off, the same records give every run."""
    from acmrl.teacher.dataset import build_dataset, read_records

    cfg = config(tmp_path)
    env = load("kb_search", preset="tiny", seed=0)
    first = env.tasks("train")[0]
    answer = first.answer if isinstance(first.answer, str) else first.answer[0]
    early = student(tiny.tokenizer)

    def reply(session_id: str, prompt: str) -> str:
        if "#edit" in session_id and session_id.startswith(first.id + "#"):
            return format_tool_call("answer", {"text": answer})  # every resume of task 0 solves it
        return early.reply(session_id, prompt)

    stats = run_annotate(cfg, engine=ScriptedEngine(tiny.tokenizer, reply))
    records = read_records(tmp_path / "ann")
    solved = [r["task_id"] for r in records if all(t["score"] >= 1 for t in r["resumed"])]
    assert solved == [first.id] and cfg.solve_filter  # on by default
    assert stats["solved_dropped"] == 1
    assert stats["student_trajectories"] == 6 and stats["resumed_runs"] == 12  # 3 tasks left
    _, off = build_dataset(tmp_path / "ann", solve_filter=False)
    assert off["solved_dropped"] == 0 and off["student_trajectories"] == 8
    assert off["resumed_runs"] == 16 and off["resumed_success"] == 4


def test_the_llm_teacher_sees_gold_evidence_beside_the_reference(tiny):
    """As in the ACM reference, the LLM teacher's prompt holds excerpts of the gold documents."""
    from acmrl.teacher.llm import gold_evidence

    task, ep = _student_episode(tiny, "acm")
    env = load("kb_search", preset="tiny", seed=0)
    prompts: list[str] = []

    def reply(session: str, prompt: str) -> str:
        prompts.append(prompt)
        return '{"kind": "no_action"}'

    teacher = LLMTeacher(
        ScriptedEngine(tiny.tokenizer, reply), tiny.tokenizer, evidence=gold_evidence(env)
    )
    teacher.assess(task, ep.traj, ep.budget, ep.tools)
    gold = task.metadata["gold_docs"]
    assert gold and "Gold evidence (excerpts" in prompts[0]
    for doc_id in gold:
        doc = next(d for d in env.documents if d.id == doc_id)
        assert f"- [{doc_id}] {doc.title}: " in prompts[0]
    # an environment without documents: the task file's evidence sentences, or no section
    plain = gold_evidence(object())
    assert plain(task.__class__("t", "?", "a")) == []
    said = task.__class__("t", "?", "a", {"evidence": ["The key is 42."]})
    assert plain(said) == [("evidence 1", "The key is 42.")]
