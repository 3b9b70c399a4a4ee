"""Demonstrations a student can learn from: every call is grounded in what its context shows.

The oracle knows the answer; a demonstration that uses that knowledge where the student cannot
(an id compacted away, an answer no longer in view, a summary of facts the summariser was not
shown) teaches it to invent. These tests hold the teacher to what the agent could see.
"""

from __future__ import annotations

import copy
import statistics

import pytest

from acmrl.config import AgentConfig, SamplingConfig
from acmrl.context.evolve import APPLIED_CODE
from acmrl.envs import load
from acmrl.teacher.demonstrate import demonstrate


@pytest.fixture(scope="module")
def world():
    return load("mixture", env="kb_search", seeds=[1, 2], options={"preset": "tiny"})


def acm_demos(world, tokenizer, budget, spread):
    return demonstrate(
        world,
        world.tasks("train"),
        ["acm"],
        tokenizer,
        agent=AgentConfig(max_turns=12, max_context_tokens=budget, context_signal=True),
        sampling=SamplingConfig(max_new_tokens=96),
        pressure=0.75,
        pressure_spread=spread,
    )


@pytest.fixture(scope="module")
def demos(world, tokenizer):
    return acm_demos(world, tokenizer, 1400, [0.6, 0.9])


def test_a_mixture_routes_each_task_to_its_own_world(world):
    tasks = world.tasks("train")
    assert len(tasks) == 32 and len({t.id.split("/")[2] for t in tasks}) == 2  # s1, s2
    assert world.name == "kb_search" and len(world.tasks("eval")) == 16
    for task in (tasks[0], tasks[-1]):
        session = world.session(task)
        for name, args in world.oracle_plan(task):
            session.call(name, args)
        assert session.score() == 1.0


def test_demonstrations_open_only_what_the_context_shows(demos, tokenizer):
    opened = answered = 0
    for d in demos:
        for step in d.steps:
            if step.call is None:
                continue
            prompt = tokenizer.decode(step.call.prompt_ids)
            for action in step.actions:
                if action["name"] == "open":  # by an id in search results or in its notes
                    opened += 1
                    assert action["arguments"]["doc_id"] in prompt
                if action["name"] == "answer":  # the answer is in view, not remembered
                    answered += 1
                    assert action["arguments"]["text"] in prompt
    assert opened >= 1.5 * len(demos) and answered >= 0.7 * len(demos)


def test_teacher_notes_come_from_what_the_summariser_was_shown(demos, tokenizer):
    notes = 0
    for d in demos:
        for step in d.steps:
            for call in step.helper_calls:
                shown = tokenizer.decode(call.prompt_ids)
                for line in tokenizer.decode(call.completion_ids[:-1]).splitlines():
                    line = line.removeprefix("- ")
                    if line.startswith("To read next: "):
                        doc_id = line.split()[3]
                        assert doc_id in shown
                    elif line.startswith("Documents read: "):
                        assert all(i in shown for i in line[16:].rstrip(".").split(", "))
                    elif line.startswith("Next: "):  # its query's words, id or answer shown
                        target = line.split(" ", 2)[2].rstrip(".").strip('"').removeprefix('for "')
                        assert all(w in shown for w in target.split()), line
                    else:  # a document's sentence, verbatim
                        assert line in shown, line
                    notes += 1
    assert notes > len(demos)


def test_the_turn_after_a_compaction_follows_the_summarys_plan(demos, tokenizer):
    """Each summary ends with the plan's next call where its steps determine it, and the next
    policy turn makes that call, saying so: the plan survives the compaction."""
    followed = 0
    for d in demos:
        steps = [s for s in d.steps if s.call is not None]
        for i, step in enumerate(steps[:-1]):
            for call in step.helper_calls:
                notes = tokenizer.decode(call.completion_ids[:-1]).splitlines()
                plan = [n for n in notes if n.startswith("- Next: ")]
                assert len(plan) == 1 and notes[-1] == plan[0], notes
                (action,) = steps[i + 1].actions
                verb, _, what = plan[0][8:].rstrip(".").partition(" ")
                value = next(iter(action["arguments"].values()))
                assert action["name"] == verb and value == what.removeprefix("for ").strip('"')
                # one rule for the turn after any compaction: continue the summary's plan
                rationale = steps[i + 1].text.split("\n<tool_call>")[0]
                assert rationale == f"My summary says what I do next: {plan[0][8:]}"
                followed += 1
    assert followed >= 2 * len(demos)


def test_teacher_turns_fit_the_completion_cap(demos):
    assert sum(d.score == 1.0 for d in demos) >= 0.9 * len(demos)
    lengths = [len(s.call.completion_ids) for d in demos for s in d.steps if s.call]
    # the demo and eval cap is 96 new tokens: every turn leaves a sixth of it spare (the longest
    # is the lookup search, which states the key fact before its query)
    assert max(lengths) <= 80


def test_compaction_timing_varies_where_the_budget_leaves_room(world, tokenizer):
    """With a 1,400-token budget on tiny, every document read takes the context past 0.8 of it,
    so the teacher must compact after each one whatever its pressure; with room to spare, each
    task compacts at its own drawn point, and GRPO has timings to choose between."""
    demos = acm_demos(world, tokenizer, 2000, [0.4, 0.9])
    assert all(d.score == 1.0 for d in demos)
    at = [
        next(len(s.call.prompt_ids) for s in d.steps if s.events) / 2000
        for d in demos
        if d.metrics["compactions"]
    ]
    assert len(at) >= len(demos) // 2
    assert statistics.pstdev(at) > 0.03 and len({round(x, 2) for x in at}) > len(at) // 3


def test_reasoned_answers_restate_the_key_fact_not_the_answer(world, tokenizer):
    task = world.tasks("train")[0]
    (demo,) = demonstrate(
        world,
        [task],
        ["acm"],
        tokenizer,
        agent=AgentConfig(max_turns=12, max_context_tokens=1400, context_signal=True),
        sampling=SamplingConfig(max_new_tokens=96),
        answers="reasoned",
    )
    last = demo.steps[-1]
    assert demo.score == 1.0 and last.actions[0]["name"] == "answer"
    rationale = last.text.split("<tool_call>")[0]
    year = task.metadata["key_fact"].split()[-1].rstrip(".")
    town = task.metadata["entities"][-1]
    assert (
        rationale.strip()
        == f"{task.metadata['key_fact']} So I need the event held in {town} in {year}."
    )
    assert task.answer not in rationale  # what it looks for, never the answer itself
    assert task.metadata["key_fact"] in tokenizer.decode(last.call.prompt_ids)  # in view


def test_structured_memory_format_from_the_summariser_prompt(world, tokenizer):
    """agent.summary_format=structured: the summariser is asked for the reference's two sections,
    and the teacher's summaries (the student's targets) come in them, still grounded."""
    from acmrl.config import ConfigError, RolloutConfig, load_config

    # its section headers cost ~25 tokens per summary: at 1,400 half of these runs overflow
    # (16 tasks: notes 16 succeed, structured 8), so the budget here is 1,600
    agent = AgentConfig(
        max_turns=12, max_context_tokens=1600, context_signal=True, summary_format="structured"
    )
    runs = demonstrate(
        world,
        world.tasks("train")[:6],
        ["acm"],
        tokenizer,
        agent=agent,
        sampling=SamplingConfig(max_new_tokens=96),
        pressure=0.75,
    )
    calls = [c for d in runs for s in d.steps for c in s.helper_calls]
    assert calls and sum(d.score >= 1 for d in runs) >= 5
    for call in calls:
        assert "Knowledge state:" in tokenizer.decode(call.prompt_ids)
        summary = tokenizer.decode(call.completion_ids[:-1])
        assert summary.startswith("Knowledge state:\n- ") and "\nThoughts:\n- " in summary
    with pytest.raises(ConfigError, match=r"agent\.summariser_prompt: .* missing \{steps\}"):
        load_config(RolloutConfig, None, ["agent.summariser_prompt=Summarise {task}"])


def _timed_demos(world, tasks, tokenizer, late_share, **kwargs):
    """`acm` demonstrations at 1,300 tokens with spread pressure and the given late share."""
    return demonstrate(
        world,
        tasks,
        ["acm"],
        tokenizer,
        agent=AgentConfig(max_turns=12, max_context_tokens=1300, context_signal=True),
        sampling=SamplingConfig(max_new_tokens=96),
        pressure=0.75,
        pressure_spread=[0.5, 0.9],
        late_share=late_share,
        **kwargs,
    )


def test_late_demonstrations_answer_without_a_last_compaction(world, tokenizer):
    """teacher.late_share: a late task compacts only when the next result would not fit, so
    once the event's document is read it answers at once, where a task compacting at its
    pressure compacts first. Both succeed; the late one costs a compaction less, and the oracle
    teacher injects no compaction before a final answer (nothing more is to be read)."""
    from acmrl.teacher.oracle import OracleTeacher

    tasks = world.tasks("train")[:6]
    early, late = (_timed_demos(world, tasks, tokenizer, share) for share in (0.0, 1.0))
    assert all(d.score == 1.0 for d in early + late)
    for e, x in zip(early, late, strict=True):
        names_e = [a["name"] for s in e.steps for a in s.actions]
        names_x = [a["name"] for s in x.steps for a in s.actions]
        assert names_e[-2:] == ["manage_context", "answer"]  # compacts before it answers
        assert names_x[-2] != "manage_context" and names_x[-1] == "answer"
        assert x.metrics["compactions"] == e.metrics["compactions"] - 1
        cost_x, cost_e = (
            sum(ev.compaction_cost for s in d.steps for ev in s.events) for d in (x, e)
        )
        assert cost_x < 0.8 * cost_e
        # a student that answers as late at high pressure is left alone by the teacher
        assert len(x.steps[-1].call.prompt_ids) >= 0.75 * 1300
        student = copy.deepcopy(x)
        for s in student.steps:
            if s.call is not None:
                s.call.role, s.origin = "policy", "policy"
        teacher = OracleTeacher(world, pressure=0.75, tokenizer=tokenizer)
        task = next(t for t in tasks if t.id == x.task_id)
        assert teacher.assess(task, student, 1300).kind == "no_action"


def test_cited_answers_quote_the_event_document_just_read(world, tokenizer):
    """teacher.answers=cited: an answer given right after the event's document is read cites
    that document's id and its sentence naming the event, town and year, both in view, so the
    answer turn's words depend on what was read (after the person's document no such sentence
    exists); an answer after a compaction still follows the summary's plan. The rationale passes
    the teacher's validators, and a correction that answers cites the same way."""
    from acmrl.teacher.assessment import Assessment, validate
    from acmrl.teacher.oracle import OracleTeacher

    tasks = world.tasks("train")[:6]
    runs = {
        share: _timed_demos(world, tasks, tokenizer, share, answers="cited") for share in (0.0, 1.0)
    }
    for share, demos in runs.items():
        for d in demos:
            task = next(t for t in tasks if t.id == d.task_id)
            last = d.steps[-1]
            rationale = last.text.split("<tool_call>")[0].strip()
            prompt = tokenizer.decode(last.call.prompt_ids)
            assert d.score == 1.0 and last.actions[0]["name"] == "answer"
            if share == 0.0:  # compacted first: the summary's plan, as before
                assert rationale.startswith("My summary says what I do next: answer")
                continue
            doc, says = rationale.split(" says ", 1)
            sentence = says.removesuffix(", so I can give my answer now.")
            assert f"[{doc}] {task.answer}\n\n" in prompt  # the event's own document, in view
            assert sentence[1:] + "." in prompt and task.answer in sentence
            assert task.metadata["entities"][-1] in sentence
            a = Assessment("correction", 0, last.actions[0], rationale, "oracle")
            tools = world.session(task).tools
            assert validate(a, seen=prompt, reference=task.answer, tools=tools) == []
    # the student answers wrongly right after the event's document: the correction cites it
    x = copy.deepcopy(runs[1.0][0])
    task = next(t for t in tasks if t.id == x.task_id)
    for s in x.steps:
        if s.call is not None:
            s.call.role, s.origin = "policy", "policy"
    x.steps[-1].actions = [{"name": "answer", "arguments": {"text": "Nothing"}}]
    for answers, start in (
        ("cited", f"{x.steps[-2].actions[0]['arguments']['doc_id']} says "),
        ("plain", "I have read everything"),
    ):
        teacher = OracleTeacher(world, pressure=0.75, tokenizer=tokenizer, answers=answers)
        a = teacher.assess(task, x, 1300)
        assert a.kind == "correction" and a.action["arguments"]["text"] == task.answer
        assert a.rationale.startswith("My answer does not match what I have read. " + start)


def test_each_arm_demonstrates_its_own_best_policy_on_chain(tokenizer):
    """teacher.policy=best: the acm teacher asks its archive for the recall questions' detail,
    the summary teacher reads the document again, and a react teacher, whose best policy cannot
    reach the third document, fails (so nothing of it is trained by default)."""
    env = load("kb_search", preset="chain", seed=0)
    tasks = env.tasks("eval")[:20]  # 14 ledger, 6 recall questions
    demos = demonstrate(
        env,
        tasks,
        ["react", "summary", "acm"],
        tokenizer,
        # annotation's own rule: an overflow fails the demonstration (acm compacts before a
        # query_memory whose extract would not fit, or 4 of these 20 would)
        agent=AgentConfig(max_turns=30),
        sampling=SamplingConfig(max_new_tokens=96),
        policy="best",
    )
    by = {(d.task_id, d.arm): d for d in demos}
    for task in tasks:
        acm, summary, react = (by[(task.id, arm)] for arm in ("acm", "summary", "react"))
        assert acm.score == summary.score == 1.0 and react.score == 0.0, task.id
        calls = [a["name"] for s in acm.steps for a in s.actions]
        recall = task.metadata["question"] == "recall"
        assert ("query_memory" in calls) == recall, (task.id, calls)
        # the answer turn cites the sentence in view that states the answer
        last = [s for s in acm.steps if s.call is not None][-1]
        assert last.text.startswith(env.answer_evidence(task)[-1].text.rstrip(".")), last.text


def _evolve_demos(env, tasks, tokenizer, **agent):
    """The evolve arm's best-policy demonstrations at chain's 2,048 tokens, the State described
    in a sentence, a program after every read (``pressure`` 0.05), room for it in one turn."""
    return demonstrate(
        env,
        tasks,
        ["evolve"],
        tokenizer,
        agent=AgentConfig(
            max_turns=30,
            max_context_tokens=2048,
            evolve_prompt="none",
            on_overflow="force_answer",
            **agent,
        ),
        sampling=SamplingConfig(max_new_tokens=512),
        pressure=0.05,
        policy="best",
    )


def test_evolve_programs_drop_spent_steps_and_fit_where_the_code_leaves(tokenizer):
    """The teacher's program drops the spent steps (earlier evolve calls with their receipts,
    searches already followed by a read, all but the latest thought), so the State holds one
    evolve call at most; with the program's text out of the context (agent.evolve_keep_code:
    false) the same plan fits a budget that the kept text overflows."""
    chain = load("kb_search", preset="chain", seed=1)
    tasks = chain.tasks("train")[:4]
    runs = {
        keep: _evolve_demos(chain, tasks, tokenizer, evolve_keep_code=keep)
        for keep in (True, False)
    }
    for d in runs[False]:
        calls = [i for i in d.final_state if i.get("type") == "function_call"]
        programs = [i for i in calls if i["name"] == "evolve"]
        assert len(programs) <= 1 and all(p["arguments"] == APPLIED_CODE for p in programs)
        edits = [a for s in d.steps for a in s.actions if a["name"] == "evolve"]
        assert len(edits) >= 2 and d.score == 1.0, d.task_id
        # of the searches only the one not yet followed by a read can be left
        assert sum(i["name"] == "search" for i in calls) <= 1
    assert sum(d.score for d in runs[True]) < sum(d.score for d in runs[False])


def test_evolve_reads_a_cut_document_again_under_the_repeat_rule(tokenizer):
    """A recall question needs a membership line the program cut before the lodge was known:
    the evolve teacher reads the person's document again, which the repeat rule allows because
    the result is no longer in the context as it was returned (it refused it before 2026-12-07,
    and every recall demonstration of the chain protocol failed)."""
    chain = load("kb_search", preset="chain", seed=1)
    tasks = [t for t in chain.tasks("train") if t.metadata["question"] == "recall"][:2]
    demos = _evolve_demos(chain, tasks, tokenizer, evolve_keep_code=False, repeat_rule=True)
    for d in demos:
        person = d.steps[1].actions[0]
        opens = [a for s in d.steps for a in s.actions if a == person]
        refused = [o for s in d.steps for o in s.observations if o.startswith("You already")]
        assert d.score == 1.0 and len(opens) == 2 and not refused, d.task_id
