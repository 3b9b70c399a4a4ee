"""env.name=mcp against a real MCP server (tests/fixtures/mcp_docs_server.py, started as a
subprocess over stdio): its tools become the agent's, acmrl eval runs on it in react and acm,
tool errors and timeouts are observations, and a server killed mid-episode is restarted."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from acmrl.config import EvalConfig
from acmrl.context.render import format_tool_call
from acmrl.engines.scripted import ScriptedEngine
from acmrl.envs import EnvError, load
from acmrl.envs.mcp import read_tasks
from acmrl.eval.run import run_eval
from acmrl.rollout.worker import read_trajectories

pytest.importorskip("mcp")

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SERVER = [sys.executable, str(FIXTURES / "mcp_docs_server.py")]
TASKS = str(FIXTURES / "mcp_tasks.jsonl")


@pytest.fixture(scope="module")
def env():
    e = load("mcp", tasks=TASKS, command=[*SERVER, "--with-wait"], timeout_s=2)
    yield e
    e.close()


def test_the_servers_tools_are_the_agents(env):
    names = [t["function"]["name"] for t in env.tools()]
    assert names == ["search", "read", "wait"]
    assert env.tools()[0]["function"]["parameters"]["required"] == ["query"]
    assert [len(env.tasks(s)) for s in ("train", "eval")] == [4, 4]
    task = next(t for t in env.tasks("eval") if t.id == "sched-priority")
    s = env.session(task)
    assert [n["function"]["name"] for n in s.tools][-1] == "answer"
    hits = s.call("search", {"query": "scheduler priority numbers"})
    assert hits.splitlines()[0] == "[sched] sched: A generally useful event scheduler class."
    assert "lower priority numbers mean higher priority" in s.call("read", {"doc_id": "sched"})
    # errors, bad arguments and a call past the timeout are observations, not exceptions
    assert s.call("read", {"doc_id": "nope"}).startswith("Error: ")
    assert "no document 'nope'" in s.call("read", {"doc_id": "nope"})
    assert s.call("read", {"doc": "sched"}).startswith("Error: read is missing argument")
    assert s.call("wait", {"seconds": 5}) == "Error: wait did not answer within 2 s"
    assert s.call("search", {"query": "heap"}).startswith("[heapq]")  # still connected
    s.call("answer", {"text": "higher"})
    assert s.score() == 1.0
    assert env.answer_evidence(task)[0].text == "lower priority numbers mean higher priority"
    with pytest.raises(NotImplementedError, match="no expert plan"):
        env.oracle_plan(task)


def test_bad_task_files_and_options_are_named(tmp_path):
    bad = tmp_path / "t.jsonl"
    for rows, message in (
        (
            ['{"prompt": "q?", "answer": "a"}', '{"prompt": "", "answer": "a"}'],
            r"t.jsonl:2: 'prompt'",
        ),
        (['{"prompt": "q?", "answer": {"a": 1}}'], r":1: answer must be a string, got dict"),
        (
            [
                '{"id": "a", "prompt": "q?", "answer": "x"}',
                '{"id": "a", "prompt": "r?", "answer": "y"}',
            ],
            "task id 'a' is used twice",
        ),
        (['{"prompt": "q?", "answer": "x", "aliases": {"x": "X"}}'], "must be a list of strings"),
        (['{"prompt": "q?", "answer": "x", "answer_set": "false"}'], "answer_set must be true"),
        (['{"prompt": "q?", "answer": ""}'], "must not be empty"),
        (['{"prompt": "q?", "answer": "x", "split": null}'], "'split' must be a non-empty"),
        (['{"prompt": "q?", "answer": "x", "hint": "y"}'], r"unknown key\(s\) \['hint'\]"),
    ):
        bad.write_text("\n".join(rows) + "\n")
        with pytest.raises(EnvError, match=message):
            read_tasks(bad)
    bad.write_text('{"prompt": "q?", "answer": "New York", "aliases": ["NYC"]}\n')
    (task,) = read_tasks(bad)["eval"]
    assert task.metadata["aliases"] == {"New York": ["NYC"]}
    bad.write_text(
        '{"prompt": "q?", "answer": "New York", "aliases": ["NYC"]}\n'
        '{"prompt": "r?", "answer": ["Oslo", "Bergen"], "answer_set": true}\n'
    )
    e = load("mcp", tasks=str(bad), command=SERVER)
    try:
        alias, answer_set = e.tasks("eval")
        # scored by the environment: an alias is the answer; an answer set needs every item
        assert e.score(alias, "nyc") == 1.0 and e.score(alias, "Boston") == 0.0
        assert e.score(answer_set, "Bergen, Oslo") == 1.0
        assert 0.0 < e.score(answer_set, "Oslo") < 1.0
    finally:
        e.close()
    with pytest.raises(EnvError, match="exactly one of command"):
        load("mcp", tasks=TASKS)
    with pytest.raises(EnvError, match="cannot start the server"):
        load("mcp", tasks=TASKS, command=[sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(EnvError, match=r"a tool 'evolve', a name acmrl's arms use"):
        load("mcp", tasks=TASKS, command=[*SERVER, "--extra-tool", "evolve"])


def test_a_server_stuck_at_start_is_stopped(tmp_path):
    import psutil

    pid = tmp_path / "pid"
    command = [*SERVER, "--hang", "--pid-file", str(pid)]
    with pytest.raises(EnvError, match="did not start within 3"):
        load("mcp", tasks=TASKS, command=command, start_timeout_s=3)
    n = int(pid.read_text())
    assert not psutil.pid_exists(n) or psutil.Process(n).status() == psutil.STATUS_ZOMBIE


def test_a_server_that_cannot_restart_is_given_up_not_retried_forever(tmp_path):
    """Killed, and its command now failing at start: the call is an Error: observation, the
    episode is marked; after max_restarts failed restarts later calls answer at once."""
    pid, block = tmp_path / "pid", tmp_path / "block"
    command = [*SERVER, "--pid-file", str(pid), "--fail-if", str(block)]
    env = load("mcp", tasks=TASKS, command=command, max_restarts=2, start_timeout_s=20)
    try:
        s = env.session(env.tasks("eval")[0])
        assert s.call("search", {"query": "heap"}).startswith("[heapq]")
        block.write_text("")
        os.kill(int(pid.read_text()), signal.SIGKILL)
        for _ in range(2):
            assert "did not restart" in s.call("search", {"query": "heap"})
        assert len(s.incidents) == 2 and env.down
        assert s.call("search", {"query": "heap"}).startswith("Error: the tool server is down")
    finally:
        env.close()


def reader(tasks: dict[str, str], kill: Path | Callable[[], None] | None = None, prefix: str = ""):
    """A scripted policy: search with the question, read the top hit, compact (acm), answer
    with the reference. With ``kill`` (a pid file, or a function), it kills the server between
    its search and its read, once. ``prefix`` goes before the server's tool names."""
    turns: dict[str, int] = {}
    if isinstance(kill, Path):
        pid_file = kill

        def kill() -> None:
            if pid_file.exists():
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
                pid_file.unlink()

    killed = []

    def reply(session_id: str, prompt: str) -> str:
        if session_id.endswith("/summariser"):
            return "I searched and read the document that answers the question."
        n = turns[session_id] = turns.get(session_id, -1) + 1
        question = next(q for q in tasks if q in prompt)
        if n == 0:
            return format_tool_call(prefix + "search", {"query": question})
        if n == 1:
            if kill is not None and not killed:
                kill()
                killed.append(True)  # once
            top = re.findall(r"\[([a-z_]+)\] \1\b", prompt)[0]  # search shows "[id] id"
            return format_tool_call(prefix + "read", {"doc_id": top})
        if n == 2 and "#acm#" in session_id:
            return format_tool_call("manage_context", {})
        return format_tool_call("answer", {"text": tasks[question]})

    return reply


def eval_config(tmp_path: Path, command: list[str]) -> EvalConfig:
    cfg = EvalConfig(output=str(tmp_path / "eval"), arms=["react", "acm"], machine="test CPU")
    cfg.env.name = "mcp"
    cfg.env.options = {"tasks": TASKS, "command": command}
    cfg.env.limit = 2
    cfg.agent.max_context_tokens = 4096
    cfg.agent.max_turns = 6
    return cfg


def check_reader_eval(report: dict, out: Path) -> list:
    """The reader's eval: every episode solved in both arms, with its tool calls, acm compacting,
    no server incident; the trajectories."""
    for arm in ("react", "acm"):
        assert report["arms"][arm]["pass@1"] == 1.0, arm
        assert report["arms"][arm]["tool_calls"] >= 3
    assert report["arms"]["acm"]["compactions"] >= 1
    trajs = read_trajectories(out / "episodes.jsonl")
    assert all(t.metrics["env_incidents"] == 0 for t in trajs)
    return trajs


def test_acmrl_eval_runs_on_the_mcp_server_in_react_and_acm(tmp_path, tokenizer):
    cfg = eval_config(tmp_path, SERVER)
    tasks = {t.prompt: t.answer for t in read_tasks(TASKS)["eval"]}
    report = run_eval(cfg, engine=ScriptedEngine(tokenizer, reader(tasks)))
    trajs = check_reader_eval(report, tmp_path / "eval")
    obs = [o for t in trajs for s in t.steps for o in s.observations]
    assert any("Each instance of this class manages its own queue" in o for o in obs)


def test_acmrl_eval_runs_on_a_server_given_by_url(tmp_path, tokenizer):
    """``url``: the same server on the streamable HTTP transport, started apart from acmrl (as
    a user's running service); the eval is the reader's, in react and acm."""
    import socket
    import subprocess
    import time

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    proc = subprocess.Popen([*SERVER, "--http", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        cfg = eval_config(tmp_path, SERVER)
        cfg.env.options = {"tasks": TASKS, "url": f"http://127.0.0.1:{port}/mcp"}
        tasks = {t.prompt: t.answer for t in read_tasks(TASKS)["eval"]}
        report = run_eval(cfg, engine=ScriptedEngine(tokenizer, reader(tasks)))
    finally:
        proc.kill()
        proc.wait()
    check_reader_eval(report, tmp_path / "eval")


def test_a_server_killed_mid_episode_is_restarted_and_the_episode_marked(tmp_path, tokenizer):
    pid = tmp_path / "server.pid"
    cfg = eval_config(tmp_path, [*SERVER, "--pid-file", str(pid)])
    cfg.arms, cfg.env.limit = ["react"], 1
    tasks = {t.prompt: t.answer for t in read_tasks(TASKS)["eval"]}
    report = run_eval(cfg, engine=ScriptedEngine(tokenizer, reader(tasks, kill=pid)))
    (traj,) = read_trajectories(tmp_path / "eval" / "episodes.jsonl")
    assert traj.metrics["env_incidents"] == 1
    assert traj.status == "answered" and report["arms"]["react"]["pass@1"] == 1.0
    read = [o for s in traj.steps for o in s.observations if "Each instance" in o]
    assert read, "the read after the kill reached the restarted server"
    report_md = (tmp_path / "eval" / "report.md").read_text()
    assert "1 episode(s) went through a tool-server restart" in report_md
    assert "env_incidents" in (tmp_path / "eval" / "episodes.csv").read_text().splitlines()[0]


ARMS = ("react", "summary", "memory", "acm", "evolve")


def cli_eval_every_arm(out: Path, model: Path, env: list[str]) -> None:
    """``acmrl eval`` from the command line on the tiny model, one task in each of the five arms:
    every arm's tools, prompt and context handling run on the environment, and every episode
    ends with a status and a score."""
    from typer.testing import CliRunner

    from acmrl.cli import app

    args = [
        "eval",
        f"model.name={model}",
        *env,
        "env.limit=1",
        f"arms=[{','.join(ARMS)}]",
        "agent.max_turns=2",
        "sampling.max_new_tokens=8",
        f"output={out}",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    trajs = read_trajectories(out / "episodes.jsonl")
    assert sorted(t.arm for t in trajs) == sorted(ARMS)
    assert all(t.status and t.score is not None and t.steps for t in trajs)
    report = (out / "report.md").read_text()
    assert all(f"| {arm} |" in report for arm in ARMS)


def test_the_cli_evaluates_a_model_on_the_mcp_server(tmp_path, tiny_model_dir):
    """``acmrl eval env.name=mcp`` from the command line, on the tiny model, in every arm."""
    command = json.dumps(SERVER)
    env = ["env.name=mcp", f"env.options={{tasks: {TASKS}, command: {command}}}"]
    cli_eval_every_arm(tmp_path / "cli", tiny_model_dir, env)


def test_audit_reports_what_it_can_without_a_plan(tmp_path, tiny_model_dir):
    """No expert plan: no scripted ceilings; the trivial strategies that need none (the first
    search result, the most frequent and a random training answer) and the model itself in
    react, on the real server."""
    from acmrl.config import AuditConfig
    from acmrl.eval.audit import run_audit

    cfg = AuditConfig(output=str(tmp_path / "audit"))
    cfg.model.name = str(tiny_model_dir)
    cfg.env.name, cfg.env.options, cfg.env.limit = "mcp", {"tasks": TASKS, "command": SERVER}, 2
    cfg.agent.max_turns, cfg.model_tokens = 2, 8
    report = run_audit(cfg)
    rows = {r["strategy"]: r for r in report["strategies"]}
    assert set(rows) == {"first_result", "frequent", "random", "model"}
    assert "no expert plan" in report["no_plan"]
    assert rows["first_result"]["tool_calls"] == 2  # it searched the real server, then answered
    firsts = [
        json.loads(line)
        for line in (tmp_path / "audit" / "episodes.jsonl").read_text().splitlines()
        if "#first_result" in line
    ]
    docs = {p.stem for p in (FIXTURES / "mcp_docs").glob("*.md")}
    assert firsts and all(t["answer"] in docs for t in firsts)  # a title the server listed
    assert all(r["episodes"] == 2 for r in rows.values())
    md = (tmp_path / "audit" / "audit.md").read_text()
    assert "No expert plan" in md and "| model | react |" in md


def test_the_stages_that_need_a_plan_say_so(tmp_path, tiny_model_dir):
    from acmrl.config import AnnotateConfig
    from acmrl.teacher.annotate import run_annotate

    for kw in ({"demonstrations": True}, {}):
        cfg = AnnotateConfig(output=str(tmp_path / "a"), **kw)
        cfg.model.name = str(tiny_model_dir)
        cfg.env.name, cfg.env.options = "mcp", {"tasks": TASKS, "command": SERVER}
        if not kw:
            cfg.teacher.kind = "oracle"
        with pytest.raises(
            ValueError, match=r"needs the environment's expert plan.*teacher\.kind=llm"
        ):
            run_annotate(cfg)


def annotate_config(tmp_path: Path, model: Path, teacher_urls: list[str], turns: int):
    """acmrl annotate on the MCP server's first 2 train tasks, react, the tiny student, the LLM
    teacher at ``teacher_urls``."""
    from acmrl.config import AnnotateConfig

    cfg = AnnotateConfig(output=str(tmp_path / "annotate"))
    cfg.model.name = str(model)
    cfg.env.name, cfg.env.options = "mcp", {"tasks": TASKS, "command": SERVER}
    cfg.env.split, cfg.env.limit, cfg.arms = "train", 2, ["react"]
    cfg.agent.max_turns, cfg.sampling.max_new_tokens = turns, 8
    cfg.teacher.kind, cfg.teacher.base_urls = "llm", teacher_urls
    return cfg


def test_annotate_with_a_served_llm_teacher_on_the_mcp_server(tmp_path, tiny_model_dir):
    """acmrl annotate on the MCP environment, the LLM teacher served by ``acmrl serve`` (the
    tiny random model stands in for a strong one: its replies are not valid assessments, which
    the card counts as such); the student is the tiny model too."""
    from acmrl.teacher.annotate import run_annotate
    from tests.test_engine_openai import start_server

    proc, url = start_server(tiny_model_dir)
    try:
        cfg = annotate_config(tmp_path, tiny_model_dir, [url], turns=2)
        cfg.teacher.model, cfg.teacher.max_attempts, cfg.teacher.max_tokens = (
            str(tiny_model_dir),
            1,
            16,
        )
        # free replies: the failure path (under the schema a random model may well reply
        # {"kind": "no_action"}, a valid assessment; tests/test_structured.py covers that path)
        cfg.teacher.structured_output = False
        stats = run_annotate(cfg)
    finally:
        proc.kill()
        proc.wait()
    assert stats["student_trajectories"] == 2
    # 16 tokens of the tiny random model are never a valid assessment: both fail, and are counted
    assert stats["failed_assessments"] == 2 and stats["edits"] == {}
    card = (tmp_path / "annotate" / "README.md").read_text()
    assert "## Edits" in card and f"| failed_assessments | {stats['failed_assessments']} |" in card
    assert "| (none: no assessment was valid) | 0 |" in card
    assert stats["by_arm"]["react"].get("failed", 0) == stats["failed_assessments"]
    records = (tmp_path / "annotate").glob("records-*.jsonl")
    assert sum(len(p.read_text().splitlines()) for p in records) == 2


def annotate_with_a_served_valid_teacher(
    tmp_path: Path, model: Path, env: tuple[str, dict], search: str
) -> None:
    """``acmrl annotate`` on ``env`` (name, options; its first 2 train tasks) with a served
    teacher whose assessments are valid: acmrl's completions server in front of a scripted
    reply, in place of a strong model (which does not run here). The HTTP path, each
    correction (a call of the environment's ``search`` tool) spliced into the student's run,
    the student resuming through the live tool server and the card's count of edits by kind
    are real."""
    import threading

    from acmrl.engines.scripted import ScriptedEngine
    from acmrl.engines.server import make_server
    from acmrl.models import load_tokenizer
    from acmrl.teacher.annotate import run_annotate

    correction = {
        "kind": "correction",
        "step": 0,
        "action": {"name": search, "arguments": {"query": "python module documentation"}},
        "rationale": "I have not read any document yet, so I search the documentation first.",
    }
    tok = load_tokenizer(str(model))
    asked: list[str] = []

    def reply(session: str, prompt: str) -> str:
        asked.append(prompt)
        return json.dumps(correction)

    server = make_server(ScriptedEngine(tok, reply), tok, "teacher", "127.0.0.1", 0, 4)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        cfg = annotate_config(tmp_path, model, [url], turns=3)
        cfg.env.name, cfg.env.options = env
        cfg.demonstrations, cfg.resumes = False, 1
        cfg.teacher.model, cfg.teacher.served_model = str(model), "teacher"
        stats = run_annotate(cfg)
    finally:
        server.shutdown()
    assert len(asked) == 2 and all("Gold evidence" in p for p in asked)
    assert stats["edits"] == {"correction": 2} and stats["failed_assessments"] == 0
    assert stats["resumed_runs"] == 2
    card = (tmp_path / "annotate" / "README.md").read_text()
    assert "| correction | 2 |" in card
    records = [
        json.loads(line)
        for p in (tmp_path / "annotate").glob("records-*.jsonl")
        for line in p.read_text().splitlines()
    ]
    resumed = [t for r in records for t in r["resumed"]]
    assert len(resumed) == 2
    for traj in resumed:  # the correction's search ran on the server, in the resumed run
        obs = [o for s in traj["steps"] for o in s["observations"]]
        assert any(o.startswith("[") and "] " in o for o in obs), obs


def test_annotate_splices_a_valid_llm_edit_into_the_mcp_environment(tmp_path, tiny_model_dir):
    env = ("mcp", {"tasks": TASKS, "command": SERVER})
    annotate_with_a_served_valid_teacher(tmp_path, tiny_model_dir, env, "search")


def test_without_a_plan_an_evolve_edit_must_keep_the_answer_and_the_evidence():
    """An environment without an expert plan: what an LLM teacher's evolve edit must keep, if
    the State holds it, is the task's answer and its evidence sentences; a program that wipes
    the read document is refused by name, one that keeps it passes."""
    from acmrl.arms.evolve_edits import still_needed
    from acmrl.context.evolve import EVOLVE_TOOL_SCHEMA
    from acmrl.context.state import function_call, function_call_output, user
    from acmrl.teacher.assessment import Assessment, validate

    task = read_tasks(TASKS)["train"][0]
    (evidence,) = task.metadata["evidence"]
    needed = still_needed(task, None)
    assert needed == sorted({task.answer, evidence})
    state = [
        user(task.prompt),
        function_call("c0", "read", {"doc_id": "calendar"}),
        function_call_output("c0", f"[calendar] ... {evidence} ..."),
    ]
    tools = [EVOLVE_TOOL_SCHEMA]
    why = "My context is nearly full, so I will keep only what I read that the question needs."

    def check(code: str) -> list[str]:
        a = Assessment("injection", 1, {"name": "evolve", "arguments": {"code": code}}, why)
        seen = json.dumps(state)
        return validate(
            a, seen=seen, reference=task.answer, tools=tools, state=state, needed=needed
        )

    wipe = "return state.map(i => i.type === 'function_call_output' ? {...i, output: 'x'} : i);"
    assert check(wipe) == [
        f"the evolve code drops what the task still needs: {task.answer}, {evidence}"
    ]
    assert check("return state;") == []


def test_the_judge_metric_scores_the_mcp_tasks(tiny_model_dir, monkeypatch):
    """``metric: judge`` on an MCP task file: every score goes through env.judge (the tiny model
    under transformers, its verdict decided by a stand-in as a capable judge would, on the
    real prompts), so a paraphrase of the reference scores 1 where em would give 0."""
    from acmrl.config import EnvConfig
    from acmrl.rollout.environment import build_environment
    from tests.test_corpus_qa import stand_in_judge

    def verdict(said: str, ref: str) -> str:
        correct = ref.strip().casefold() in said.casefold()
        return '{"verdict": "correct"}' if correct else '{"verdict": "incorrect"}'

    prompts = stand_in_judge(monkeypatch, verdict)
    cfg = EnvConfig(name="mcp", options={"tasks": TASKS, "command": SERVER, "metric": "judge"})
    cfg.judge.model = str(tiny_model_dir)
    env = build_environment(cfg)
    try:
        task = env.tasks("train")[0]  # the calendar's first weekday: Monday
        assert env.score(task, "The calendars start their weeks on monday.") == 1.0
        assert env.score(task, "Sunday") == 0.0
    finally:
        env.close()
    assert len(prompts) == 2 and task.prompt in prompts[0]
