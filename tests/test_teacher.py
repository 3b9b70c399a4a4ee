"""Teacher: validators, the oracle teacher's edits, splice-and-resume with token origin."""

from __future__ import annotations

import json

import pytest

from acmrl.config import AgentConfig, SamplingConfig
from acmrl.context.render import format_tool_call
from acmrl.engines.scripted import ScriptedEngine, replay
from acmrl.envs import load
from acmrl.rollout.agent import Episode
from acmrl.rollout.worker import run_episodes
from acmrl.teacher.assessment import Assessment, seen_text, validate
from acmrl.teacher.oracle import OracleTeacher
from acmrl.teacher.splice import resume


@pytest.fixture(scope="module")
def env():
    return load("kb_search", preset="tiny", seed=0)


@pytest.fixture(scope="module")
def tiny(tiny_engine):
    return tiny_engine


def run(env, task, arm, texts, engine, **agent):
    ep = Episode(
        f"{task.id}#{arm}#0",
        env,
        task,
        arm,
        engine.tokenizer,
        agent=AgentConfig(**agent),
        sampling=SamplingConfig(max_new_tokens=64),
    )
    run_episodes(
        [ep], ScriptedEngine(engine.tokenizer, replay({ep.id: texts})), helper_engine=engine
    )
    return ep


def calls(plan):
    return [format_tool_call(n, a) for n, a in plan]


def check(env, ep, a):
    seen = seen_text(ep.traj, a.step, ep.renderer.tokenizer)
    names = {d.title for d in env.documents} | {d.id for d in env.documents}
    return validate(a, seen=seen, reference=ep.task.answer, tools=ep.tools, known_names=names)


def test_validators_catch_leaks_unseen_citations_and_meta_talk(env, tiny):
    task = env.tasks("eval")[0]
    ep = run(
        env,
        task,
        "acm",
        [*calls(env.oracle_plan(task)[:2]), "I think it is the Amber Fair."],
        tiny,
        max_context_tokens=4096,
    )
    step = 2  # after reading the first document only
    search = {"name": "search", "arguments": {"query": "x"}}
    good = Assessment(
        "correction",
        step,
        search,
        "I have not found the town yet, so I should search for the next link in my chain.",
    )
    assert check(env, ep, good) == []
    leak = Assessment(
        "correction",
        step,
        search,
        f"I am quite sure the event is the {task.answer}, so I will check it now.",
    )
    assert any("leaks the reference answer" in e for e in check(env, ep, leak))
    seen = seen_text(ep.traj, step)
    town = next(
        d.title
        for d in env.documents
        if d.title.endswith(("ford", "by", "Cross")) and d.title not in seen
    )
    unseen = Assessment(
        "correction",
        step,
        search,
        f"I should look at {town} and at 'kb-99999' before answering the question.",
    )
    errors = check(env, ep, unseen)
    assert any("has not seen" in e and town in e for e in errors)
    seen_name = task.metadata["entities"][1]  # named in the first document, which was read
    fine = Assessment(
        "correction",
        step,
        search,
        f"I read that {seen_name} is the next link, so I will search for it now.",
    )
    assert check(env, ep, fine) == []
    # apostrophes inside words quote nothing; a quote after them still counts
    contractions = Assessment(
        "correction",
        step,
        search,
        f"I'm sure {seen_name} is the next link. I'll search for it, since I don't know it yet.",
    )
    assert check(env, ep, contractions) == []
    quoted = Assessment(
        "correction", step, search, f"I'm going to look for '{town}' next, then I'll answer."
    )
    assert any("has not seen" in e and town in e for e in check(env, ep, quoted))
    meta = Assessment(
        "correction",
        step,
        search,
        "The teacher says my search was wrong, so I will search again for it now.",
    )
    assert any("mentions 'teacher'" in e for e in check(env, ep, meta))
    assert any(
        "first person" in e
        for e in check(
            env,
            ep,
            Assessment(
                "correction",
                step,
                search,
                "The agent should search for the next link in the chain now.",
            ),
        )
    )
    assert any(
        "words" in e for e in check(env, ep, Assessment("correction", step, search, "I search."))
    )
    bad_tool = Assessment(
        "injection",
        step,
        search,
        "My context is getting full so I will search for the next link now.",
    )
    assert any("injection is a context action" in e for e in check(env, ep, bad_tool))
    no_tool = Assessment(
        "correction",
        step,
        {"name": "evolve", "arguments": {"code": "return state;"}},
        "I will rewrite my memory so that it holds only what I need.",
    )
    assert any("has no tool 'evolve'" in e for e in check(env, ep, no_tool))
    bad_args = Assessment(
        "correction",
        step,
        {"name": "search", "arguments": {"q": 1}},
        "I still need the town, so I will search for the next link now.",
    )
    assert any("missing argument" in e for e in check(env, ep, bad_args))


def test_oracle_corrects_an_early_answer_and_repeats(env, tiny):
    task = env.tasks("eval")[0]
    teacher = OracleTeacher(env)
    early = run(env, task, "react", ["It is the Amber Fair."], tiny, max_context_tokens=4096)
    a = teacher.assess(task, early.traj, 4096)
    assert (a.kind, a.step, a.action) == (
        "correction",
        0,
        {"name": "search", "arguments": {"query": task.metadata["entities"][0]}},
    )
    assert check(env, early, a) == []
    plan = env.oracle_plan(task)
    repeat = run(
        env, task, "react", calls([plan[0], plan[0], *plan[1:]]), tiny, max_context_tokens=4096
    )
    a = teacher.assess(task, repeat.traj, 4096)
    assert (a.kind, a.step, a.action["name"]) == ("correction", 1, "open")  # the id was listed
    assert "already made this call" in a.rationale and check(env, repeat, a) == []
    expert = run(env, task, "react", calls(plan), tiny, max_context_tokens=4096)
    assert teacher.assess(task, expert.traj, 4096).kind == "no_action"


def test_a_correction_after_a_compaction_follows_the_summarys_plan(env, tiny):
    """The student compacted (its summary names the lookup) and then answered at once: the
    correction makes the call its summary planned and says so, as the demonstrations do."""
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    lookup = plan[2]
    assert lookup[0] == "search"
    script = {
        f"{task.id}#acm#0": [
            *calls(plan[:2]),
            format_tool_call("manage_context", {}),
            format_tool_call("answer", {"text": "S1"}),
        ],
        f"{task.id}#acm#0/summariser": [
            f'- {task.metadata["key_fact"]}\n- Next: search for "{lookup[1]["query"]}".'
        ],
    }
    ep = Episode(
        f"{task.id}#acm#0",
        env,
        task,
        "acm",
        tiny.tokenizer,
        agent=AgentConfig(max_context_tokens=4096),
        sampling=SamplingConfig(max_new_tokens=64),
    )
    scripted = ScriptedEngine(tiny.tokenizer, replay(script))
    run_episodes([ep], scripted, helper_engine=scripted)
    a = OracleTeacher(env, tokenizer=tiny.tokenizer).assess(task, ep.traj, 4096)
    assert (a.kind, a.step, a.action) == (
        "correction",
        3,
        {"name": "search", "arguments": lookup[1]},
    )
    said = f'My summary says what I do next: search for "{lookup[1]["query"]}".'
    assert a.rationale.endswith(said) and check(env, ep, a) == []


def test_oracle_injects_compaction_under_pressure_and_the_resume_really_compacts(env, tiny):
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    ep = run(env, task, "acm", calls(plan), tiny, max_context_tokens=1400, summary_max_tokens=16)
    a = OracleTeacher(env, pressure=0.6).assess(task, ep.traj, 1400)
    assert a.kind == "injection" and a.action == {"name": "manage_context", "arguments": {}}
    assert a.step >= 2 and check(env, ep, a) == []
    # resume: replay up to the edit, the teacher's turn, then the rest of the expert's calls
    follow = calls(plan[a.step :])
    script = ScriptedEngine(tiny.tokenizer, replay({f"{ep.traj.episode_id}#edit0": follow}))
    out = resume(
        env,
        task,
        ep.traj,
        a,
        script,
        tiny.tokenizer,
        agent=AgentConfig(max_context_tokens=1400, summary_max_tokens=16),
        sampling=SamplingConfig(max_new_tokens=64),
        helper_engine=tiny,
    )
    (traj,) = out
    origins = [s.origin for s in traj.steps]
    assert origins[: a.step] == ["policy"] * a.step and origins[a.step] == "teacher"
    assert traj.steps[a.step].events[0].kind == "manage_context"  # the compaction happened
    for i in range(a.step):  # replayed steps carry the student's own recorded call
        assert traj.steps[i].call == ep.traj.steps[i].call
    assert traj.edit["kind"] == "injection" and traj.edit["rationale"] == a.rationale
    assert traj.status == "answered" and traj.score == 1.0


def test_evolve_injection_keeps_the_facts(env, tiny):
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    ep = run(env, task, "evolve", calls(plan), tiny, max_context_tokens=2300)
    a = OracleTeacher(env, pressure=0.6).assess(task, ep.traj, 2300)
    assert a.kind == "injection" and a.action["name"] == "evolve" and check(env, ep, a) == []
    # the program names what it keeps; the rationale does not list it again
    assert a.rationale.startswith("My context is at") and "I must keep" not in a.rationale
    follow = calls(plan[a.step :])
    script = ScriptedEngine(tiny.tokenizer, replay({f"{ep.traj.episode_id}#edit0": follow}))
    (traj,) = resume(
        env,
        task,
        ep.traj,
        a,
        script,
        tiny.tokenizer,
        agent=AgentConfig(max_context_tokens=2300),
        sampling=SamplingConfig(max_new_tokens=64),
    )
    event = traj.steps[a.step].events[0]
    assert event.kind == "evolve" and event.applied
    receipt = json.loads(traj.steps[a.step].observations[-1])  # what the edit did to the State
    assert receipt["tokens_after"] < receipt["tokens_before"]
    # the event is charged on the next input actually sent
    assert event.tokens_after == len(traj.steps[a.step + 1].call.prompt_ids)
    assert traj.score == 1.0
    assert task.metadata["key_fact"] in str(traj.final_state)  # the birth year survived the edit


def test_leaks_are_caught_in_any_surface_form(env, tiny):
    """Hyphenated, re-punctuated, re-cased and partial forms of the answer."""
    task = env.tasks("eval")[0]
    ep = run(env, task, "acm", [*calls(env.oracle_plan(task)[:2]), "I give up."], tiny)
    step = 2
    search = {"name": "search", "arguments": {"query": "x"}}
    words = task.answer.split()
    assert len(words) >= 2
    planted = {
        "hyphenated": "-".join(words),
        "re-punctuated": ". ".join(words),
        "upper case, quoted": f"'{task.answer.upper()}'",
        "partial": " ".join(words[:2]),
        "partial, hyphenated": "-".join(words[-2:]).lower(),
    }
    for kind, form in planted.items():
        a = Assessment(
            "correction", step, search, f"I suspect the {form} matters, so I will search for it."
        )
        assert any("leaks the reference answer" in e for e in check(env, ep, a)), kind
    # one word of a multi-word answer alone is no leak (event kinds and adjectives recur)
    one = Assessment(
        "correction", step, search, f"I still need the {words[-1].lower()}, so I search on."
    )
    assert not any("leaks" in e for e in check(env, ep, one))


@pytest.mark.parametrize(
    "rationale",
    [
        "The reviewer pointed out that I should search for the town before answering.",
        "Following the guidance I got, I will search for the next link in the chain.",
        "I was told to search for the town first, so I will do that now.",
        "Someone told me the town matters, so I will search for it now.",
        "A hint says I should search for the next link in the chain now.",
        "The expert would search for the town here, so I will do the same.",
    ],
)
def test_meta_talk_is_caught(env, tiny, rationale):
    task = env.tasks("eval")[0]
    ep = run(env, task, "acm", [*calls(env.oracle_plan(task)[:2]), "I give up."], tiny)
    a = Assessment("correction", 2, {"name": "search", "arguments": {"query": "x"}}, rationale)
    assert any("mentions" in e for e in check(env, ep, a)), check(env, ep, a)


@pytest.mark.parametrize(
    ("rationale", "ok"),
    [
        ("The agent has not found the town. It should search for the next link. I search.", False),
        ("You should search for the town now, because the chain is not finished yet.", False),
        (
            "The first document names the town. The search comes next. The answer waits. "
            "Then I answer.",
            False,
        ),
        ("The first document names the next link. I will search for it now.", True),
        ("My chain is not finished, so I will search for the next link now.", True),
    ],
)
def test_rationale_person_is_checked_per_sentence(env, tiny, rationale, ok):
    task = env.tasks("eval")[0]
    ep = run(env, task, "acm", [*calls(env.oracle_plan(task)[:2]), "I give up."], tiny)
    a = Assessment("correction", 2, {"name": "search", "arguments": {"query": "x"}}, rationale)
    errors = check(env, ep, a)
    assert (not any("first person" in e for e in errors)) == ok, errors


def test_teacher_evolve_code_runs_in_the_sandbox_on_the_students_state(env, tiny):
    from acmrl.teacher.splice import state_before

    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    agent = AgentConfig(max_context_tokens=2300)
    sampling = SamplingConfig(max_new_tokens=64)
    ep = run(env, task, "evolve", calls(plan), tiny, max_context_tokens=2300)
    a = OracleTeacher(env, pressure=0.6).assess(task, ep.traj, 2300)
    assert a.action["name"] == "evolve"
    state = state_before(env, task, ep.traj, a.step, tiny.tokenizer, agent=agent, sampling=sampling)
    # the replayed State is the student's: the task, then its calls and their results
    assert state[0]["content"][0]["text"] == task.prompt
    assert sum(i["type"] == "function_call" for i in state) == a.step

    def valid(code):
        bad = Assessment(
            a.kind, a.step, {"name": "evolve", "arguments": {"code": code}}, a.rationale
        )
        return validate(
            bad,
            seen=seen_text(ep.traj, a.step),
            reference=task.answer,
            tools=ep.tools,
            state=state,
        )

    assert valid(a.action["arguments"]["code"]) == []  # the oracle's own edit runs
    for code, why in [
        ("return state.slice(0, -1);", "must stay the last item"),
        ("state[1].name = 42; return state;", "invalid"),
        ("throw new Error('oops');", "oops"),
        ("while (true) {}", "time limit"),
    ]:
        errors = valid(code)
        assert any("evolve code fails" in e and why in e for e in errors), (code, errors)


def test_injected_compaction_switches_a_react_run_to_acm(env, tiny):
    """The teacher injects manage_context into a run without context tools;
    the resumed episode is acm from the start (system prompt and tools rebuilt), the student's
    earlier turns replayed in it, and the compaction really runs."""
    from acmrl.arms import arm_tools
    from acmrl.train.samples import trajectory_samples

    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    ep = run(env, task, "react", calls(plan), tiny, max_context_tokens=1400)
    assert ep.traj.metrics["peak_context_tokens"] >= 0.6 * 1400
    assert OracleTeacher(env, pressure=0.6).assess(task, ep.traj, 1400).kind != "injection"
    a = OracleTeacher(env, pressure=0.6, switch_arms=True).assess(task, ep.traj, 1400)
    assert a.kind == "injection" and a.arm == "acm"
    assert a.action == {"name": "manage_context", "arguments": {}}
    seen = seen_text(ep.traj, a.step)
    acm_tools = arm_tools(ep.session.tools, "acm")
    assert validate(a, seen=seen, reference=task.answer, tools=acm_tools) == []
    assert any("has no tool" in e for e in check(env, ep, a))  # not a react tool
    follow = calls(plan[a.step :])
    script = ScriptedEngine(tiny.tokenizer, replay({f"{ep.traj.episode_id}#edit0": follow}))
    (traj,) = resume(
        env,
        task,
        ep.traj,
        a,
        script,
        tiny.tokenizer,
        agent=AgentConfig(max_context_tokens=1400, summary_max_tokens=16),
        sampling=SamplingConfig(max_new_tokens=64),
        helper_engine=tiny,
    )
    assert traj.arm == "acm" and traj.edit["switched_from"] == "react"
    first = tiny.tokenizer.decode(traj.steps[0].call.prompt_ids)
    assert "manage_context" in first and "query_memory" in first  # the acm system prompt
    for i in range(a.step):  # the student's own turns, replayed in the acm context
        assert traj.steps[i].text.strip() == ep.traj.steps[i].text.strip()
        assert traj.steps[i].call.logprobs == []  # never seen by the student in this context
    assert traj.steps[a.step].origin == "teacher"
    assert traj.steps[a.step].events[0].kind == "manage_context"
    assert traj.status == "answered" and traj.score == 1.0
    # the teacher's turn and what follows are targets; the replayed turns are not
    samples = trajectory_samples(traj, helpers=False)
    trained = [s for s in samples if any(w > 0 for w in s.weights)]
    assert trained and all("manage_context" in tiny.tokenizer.decode(s.token_ids) for s in trained)
    replayed = [traj.steps[i].call.completion_ids for i in range(a.step)]
    for s in samples:  # no replayed turn is a target
        targets = [t for t, w in zip(s.token_ids, s.weights, strict=True) if w > 0]
        assert not any(r and targets[: len(r)] == r for r in replayed)


def test_teacher_evolve_edits_keep_what_the_plan_still_needs():
    """The generic keep-facts program, run in the sandbox on a real State, keeps the ids and the
    facts the expert plan needs; a program that drops them is refused, naming what it dropped."""
    from acmrl.arms.evolve_edits import dropped, keep_facts_code, needed_terms, still_needed
    from acmrl.context.state import function_call, function_call_output, user

    env = load("kb_search", preset="tiny", seed=0)
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    session = env.session(task)
    state = [user(task.prompt)]
    for i, (name, args) in enumerate(plan[:4]):
        state += [
            function_call(f"c{i}", name, args),
            function_call_output(f"c{i}", session.call(name, args)),
        ]
    rationale = "My context is nearly full, so I will cut what I have read down to its facts now."
    terms = needed_terms(task, plan)
    assert task.answer not in json.dumps(terms)  # the program never holds the answer
    code = keep_facts_code(task, plan)
    ok = Assessment("injection", 3, {"name": "evolve", "arguments": {"code": code}}, rationale, "t")
    needed = still_needed(task, plan)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "evolve",
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string"}},
                    "required": ["code"],
                },
            },
        }
    ]
    seen = json.dumps(state)
    assert (
        validate(ok, seen=seen, reference=task.answer, tools=tools, state=state, needed=needed)
        == []
    )
    from acmrl.context.evolve import apply_evolve, evolve_call

    after = apply_evolve([*state, evolve_call("e", code)]).state[:-2]  # less call and receipt
    assert len(json.dumps(after)) < len(json.dumps(state)) * 0.8  # it did cut
    assert not dropped(state, after, needed)
    # written for the State it edits: the person's name, in every sentence of their page,
    # selects nothing and is left out; the cut keeps only the facts, and still drops nothing
    sharp = keep_facts_code(task, plan, seen, repeats=False)
    assert task.metadata["entities"][0] not in sharp.split("\n")[0] and len(sharp) < len(code)
    cut = apply_evolve([*state, evolve_call("e", sharp)]).state[:-2]
    assert len(json.dumps(cut)) < len(json.dumps(after)) and not dropped(state, cut, needed)
    for fact in task.metadata["facts"]:
        assert fact.rstrip(".").split(" is ")[-1] in json.dumps(cut)
    wipe = "return state.map(i => i.type === 'function_call_output' ? {...i, output: 'x'} : i);"
    bad = Assessment(
        "injection", 3, {"name": "evolve", "arguments": {"code": wipe}}, rationale, "t"
    )
    errors = validate(
        bad, seen=seen, reference=task.answer, tools=tools, state=state, needed=needed
    )
    assert errors == [f"the evolve code drops what the task still needs: {task.answer}"]


def test_a_switched_injection_lands_where_the_acm_replay_still_fits(env, tiny):
    """A react run switched to acm replays the student's turns under acm's longer system prompt
    and tools (~283 tokens here). The teacher that counts them (it has the student's tokenizer)
    injects where that replay still fits; counting react's inputs instead puts the edit one step
    later, where the replayed context is already over the budget and the resumed run overflows
    before the teacher's turn (the default demo's round: 0 of 32 resumes succeeded)."""
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    budget = 1300
    ep = run(env, task, "react", calls(plan), tiny, max_context_tokens=budget)
    blind = OracleTeacher(env, pressure=0.75, switch_arms=True).assess(task, ep.traj, budget)
    a = OracleTeacher(env, pressure=0.75, switch_arms=True, tokenizer=tiny.tokenizer).assess(
        task, ep.traj, budget
    )
    assert a.kind == blind.kind == "injection" and a.arm == "acm"
    assert a.step < blind.step

    def resumed(edit):
        follow = calls(plan[edit.step :])
        script = ScriptedEngine(tiny.tokenizer, replay({f"{ep.traj.episode_id}#edit0": follow}))
        (traj,) = resume(
            env,
            task,
            ep.traj,
            edit,
            script,
            tiny.tokenizer,
            agent=AgentConfig(max_context_tokens=budget, summary_max_tokens=16),
            sampling=SamplingConfig(max_new_tokens=64),
            helper_engine=tiny,
        )
        return traj

    late = resumed(blind)
    assert late.status == "overflow" and "teacher" not in [s.origin for s in late.steps]
    traj = resumed(a)
    assert traj.steps[a.step].origin == "teacher"
    assert traj.steps[a.step].events[0].kind == "manage_context"
    assert traj.status == "answered" and traj.score == 1.0
    # the rationale counts the acm context the student is in at the edit, not react's
    said = int(a.rationale.split("My context is at ")[1].split(" of")[0])
    assert abs(said - len(traj.steps[a.step].call.prompt_ids)) <= 4


def test_a_second_compaction_is_not_a_repeated_call(env, tiny):
    """manage_context takes no arguments, so two compactions are the same call twice; the second
    is a new compaction of a new history, not a lookup repeated. The teacher corrects the early
    answer after it, not the compaction (which it used to replace with a read into a full
    context)."""
    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    compact = format_tool_call("manage_context", {})
    texts = [*calls(plan[:2]), compact, *calls(plan[2:3]), compact, calls([plan[-1]])[0]]
    ep = run(env, task, "acm", texts, tiny, max_context_tokens=4096, summary_max_tokens=16)
    names = [a["name"] for s in ep.traj.steps for a in s.actions]
    assert names.count("manage_context") == 2 and names[-1] == "answer"
    a = OracleTeacher(env, pressure=0.75).assess(task, ep.traj, 4096)
    assert a.kind == "correction" and a.step == 5, (a.step, a.rationale)
    assert "already made this call" not in a.rationale


def test_teacher_evolve_program_keeps_the_lines_the_environment_names():
    """On code no name of the question selects the lines a later step needs: the program keeps
    the lines the environment's notes keep (notes_of: the whole call, every argument, so that
    which one matters stays unknown until it is read), verbatim, and the rest of the read goes;
    a line that holds the answer never enters the program."""
    from acmrl.arms.evolve_edits import keep_facts_code, kept_lines
    from acmrl.context.evolve import apply_evolve, evolve_call
    from acmrl.context.state import function_call, function_call_output, user
    from acmrl.envs.base import Task

    task = Task(
        "t", "Line 3 of `m.py` (in `f`) calls a function ...", "b, line 9", {"gold_files": ["m.py"]}
    )
    code_lines = [
        "def f(a, b):",
        "    x = 1",
        "    return h(",
        "        aa,",
        "        b)",
        "    )",
    ]
    window = "m.py lines 1-6 of 40\n" + "\n".join(
        f"{n:5d}|     {line}" for n, line in enumerate(code_lines, 1)
    )

    class Env:  # the call on lines 3-5 is what the notes keep, as code_nav's do
        def notes_of(self, task, result):
            return [f"m.py:{n}: {code_lines[n - 1].strip()}" for n in (3, 4, 5, 6)]

    keep = kept_lines(Env(), task, [window])
    assert keep == ["return h(", "aa,"]  # "b)" and ")" would select too much
    plan = [("read_file", {"path": "m.py", "start": 1}), ("answer", {"text": "b, line 9"})]
    state = [
        user(task.prompt),
        function_call("c1", "read_file", {"path": "m.py", "start": 1}),
        function_call_output("c1", window + "\n" + "    # filler line\n" * 10),
    ]
    code = keep_facts_code(task, plan, window, keep=[*keep, "b, line 9 is here"])
    assert "'return h(', 'aa,'" in code.splitlines()[0] and "line 9" not in code
    kept = apply_evolve([*state, evolve_call("e", code)]).state[2]["output"]
    assert "    3|         return h(" in kept and "    4|             aa," in kept
    assert "filler" not in kept and "x = 1" not in kept
    # without them, nothing of the question selects the call
    bare = apply_evolve([*state, evolve_call("e", keep_facts_code(task, plan, window))])
    assert "return h(" not in bare.state[2]["output"]


def test_teacher_evolve_program_drops_spent_steps_and_keeps_the_pairs():
    """The spent-step clause on a hand-built State: an earlier evolve call goes with its receipt,
    a listing that a later read followed goes with its call, the listing not yet followed stays,
    only the latest assistant message stays, and every call keeps its one result."""
    from acmrl.arms.evolve_edits import keep_facts_code
    from acmrl.context.evolve import apply_evolve, evolve_call
    from acmrl.context.state import assistant, function_call, function_call_output, user
    from acmrl.context.state import validate as valid_state
    from acmrl.envs.base import Task

    task = Task("t", "Where does Ann Lee work?", "Oslo Works", {"gold_docs": ["d1", "d2"]})
    plan = [("search", {"query": "Ann Lee"}), ("open", {"doc_id": "d1"})]
    state = [
        user(task.prompt),
        assistant("I will search for Ann Lee."),
        function_call("s1", "search", {"query": "Ann Lee"}),
        function_call_output("s1", "[d1] Ann Lee: a person."),
        evolve_call("e1", "return state;"),
        function_call_output("e1", '{"applied": true}'),
        assistant("I will open d1."),
        function_call("o1", "open", {"doc_id": "d1"}),
        function_call_output("o1", "[d1] Ann Lee\nAnn Lee works at the mill by d2."),
        function_call("s2", "search", {"query": "mill"}),
        function_call_output("s2", "[d2] The mill: a building."),
        assistant("My context is nearly full, so I will cut it."),
    ]
    code = keep_facts_code(task, plan, repeats=False)
    result = apply_evolve([*state, evolve_call("e2", code)])
    assert result.applied, result.error
    valid_state(result.state, allow_pending_evolve=False)
    ids = [i.get("call_id") for i in result.state if i["type"] != "message"]
    assert ids == ["o1", "o1", "s2", "s2", "e2", "e2"]  # s1 was followed, e1 is spent
    says = [i for i in result.state if i["type"] == "message" and i["role"] == "assistant"]
    assert [m["content"][0]["text"] for m in says] == [
        "My context is nearly full, so I will cut it."
    ]
    assert result.state[0] == state[0]  # the task stays first


def test_oracle_corrects_a_refused_or_lossy_evolve_program_with_its_own(env, tiny):
    """A student program that the sandbox refused, or that drops what the plan still needs
    (rerun on the student's own State), is replaced by the teacher's program at that step,
    which passes the validators there; the teacher's program written by the student is not."""
    from acmrl.arms.evolve_edits import gives_away, needed_terms, still_needed
    from acmrl.teacher.splice import state_before

    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    # room for a program in one turn
    agent, sampling = AgentConfig(max_context_tokens=4096), SamplingConfig(max_new_tokens=1024)

    def student(code):
        texts = [*calls(plan[:2]), format_tool_call("evolve", {"code": code}), *calls(plan[2:])]
        ep = Episode(
            f"{task.id}#evolve#0",
            env,
            task,
            "evolve",
            tiny.tokenizer,
            agent=agent,
            sampling=sampling,
        )
        run_episodes([ep], ScriptedEngine(tiny.tokenizer, replay({ep.id: texts})))
        assert ep.traj.score == 1.0  # the answer is right all the same: only the edit is bad

        def state_at(step):
            return state_before(
                env, task, ep.traj, step, tiny.tokenizer, agent=agent, sampling=sampling
            )

        return ep, OracleTeacher(env).assess(task, ep.traj, 4096, state_at), state_at

    def valid(ep, a, state_at):
        seen = seen_text(ep.traj, a.step, tiny.tokenizer)
        return validate(a, seen=seen, reference=task.answer, tools=ep.tools, state=state_at(a.step))

    refused, a, state_at = student("return state.map(i => i.;")
    assert refused.traj.steps[2].events[0].applied is False
    assert (a.kind, a.step, a.action["name"]) == ("correction", 2, "evolve")
    # the teacher's turn replaces the student's, so it speaks of no earlier program
    assert a.rationale.startswith("Before I read on I will make room")
    assert valid(refused, a, state_at) == []
    teacher_code = a.action["arguments"]["code"]
    # keeps the question and the call only: the documents' ids and years are gone, even where
    # the program's own text names them (its call is not what it kept)
    terms = [t for t in {*needed_terms(task, plan), *still_needed(task, plan)}]
    terms = sorted(t for t in terms if not gives_away(t, task))
    for code in (
        "return [state[0], state[state.length - 1]];",
        f"const need = {json.dumps(terms)};\nreturn [state[0], state[state.length - 1]];",
    ):
        lossy, b, state_at = student(code)
        assert lossy.traj.steps[2].events[0].applied is True
        assert (b.kind, b.step, b.action) == ("correction", 2, a.action), code
        assert valid(lossy, b, state_at) == []
    # without the State only a refusal is seen
    assert OracleTeacher(env).assess(task, lossy.traj, 4096).kind == "no_action"
    _, c, _ = student(teacher_code)
    assert c.kind == "no_action", (c.step, c.rationale, c.action)


def test_an_answer_edit_must_score_by_the_environments_own_metric(env, tiny):
    """An edit that answers is checked by the environment's score: the reference in any surface
    form the metric accepts passes, a wrong answer (or the reference inside a longer wrong one
    where the metric is exact) is refused; without a scorer nothing is checked."""
    task = env.tasks("eval")[0]
    ep = run(env, task, "react", [*calls(env.oracle_plan(task)), "done"], tiny)
    last = sum(1 for s in ep.traj.steps if s.call is not None and s.call.role == "policy") - 1
    why = "I have read the page of the event held in that town in that year, so I can answer now."

    def answering(text):
        a = Assessment("correction", last, {"name": "answer", "arguments": {"text": text}}, why)
        seen = seen_text(ep.traj, a.step, ep.renderer.tokenizer)
        return validate(
            a,
            seen=seen,
            reference=task.answer,
            tools=ep.tools,
            score=lambda t: env.score(task, t),
        )

    assert answering(task.answer) == []
    assert answering(f"the {task.answer.upper()}.") == []  # the metric normalises
    wrong = "the edit answers, but the answer scores below 1: a wrong answer is never productive"
    assert answering("Amber Fair") == [wrong]
    assert answering(f"{task.answer} or the Amber Fair") == [wrong]  # exact match: refused
    a = Assessment("correction", last, {"name": "answer", "arguments": {"text": "x"}}, why)
    assert validate(a, seen=ep.traj.prompt, reference=task.answer, tools=ep.tools) == []


def test_a_query_memory_edit_must_name_a_summary_that_exists(env, tiny):
    """query_memory names one of the summaries archived before the edit: before the first
    compaction there is none, after it its id is the one to name."""
    from acmrl.teacher.assessment import summaries_before

    task = env.tasks("eval")[0]
    plan = env.oracle_plan(task)
    texts = [*calls(plan[:2]), calls([("manage_context", {})])[0], "done"]
    ep = run(env, task, "acm", texts, tiny, max_context_tokens=4096)
    assert summaries_before(ep.traj, 2) == set()
    (sid,) = summaries_before(ep.traj, 3)
    why = "My summary dropped the year I read, so I will look it up in my archived steps now."

    def asking(step, summary_id):
        args = {"summary_id": summary_id, "query": "the birth year"}
        a = Assessment("injection", step, {"name": "query_memory", "arguments": args}, why)
        return validate(
            a,
            seen=seen_text(ep.traj, step, ep.renderer.tokenizer),
            reference=task.answer,
            tools=ep.tools,
            summaries=summaries_before(ep.traj, step),
        )

    assert asking(3, sid) == []
    assert asking(3, "123456789") == [
        f"query_memory names summary '123456789', which does not exist there (summaries: {sid})"
    ]
    assert asking(2, sid) == [
        f"query_memory names summary '{sid}', which does not exist there (summaries: none yet)"
    ]
