"""env.name=verifiers on a real verifiers environment (tests/fixtures/vf_envs/docs_qa: a v1
Taskset whose toolset verifiers itself serves over MCP): its tools and rubric become the
environment's, acmrl eval runs it in react and acm, a killed toolset server is restarted, and
what acmrl cannot run is refused by name."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from acmrl.config import EvalConfig
from acmrl.engines.scripted import ScriptedEngine
from acmrl.envs import EnvError, load
from acmrl.eval.run import run_eval
from acmrl.rollout.worker import read_trajectories
from tests.test_mcp import (
    annotate_with_a_served_valid_teacher,
    check_reader_eval,
    cli_eval_every_arm,
    reader,
)

pytest.importorskip("verifiers.v1")
psutil = pytest.importorskip("psutil")

ENVS = str(Path(__file__).resolve().parent / "fixtures" / "vf_envs")


@pytest.fixture(scope="module")
def env():
    e = load("verifiers", taskset="docs_qa", path=ENVS, timeout_s=5)
    yield e
    e.close()


def servers() -> set:
    """The toolset servers this process started (verifiers runs ``python -m docs_qa.tools``)."""
    found = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "docs_qa.tools" in " ".join(p.cmdline()):
                found.add(p)
        except psutil.Error:  # a short-lived child (verifiers' probe) that has gone
            pass
    return found


def test_the_tasksets_tasks_tools_and_rubric_are_the_environments(env):
    assert env.splits == ["train", "eval"]
    assert len(env.tasks("train")) == 4 and len(env.tasks("eval")) == 4
    names = sorted(t["function"]["name"] for t in env.tools())
    assert names == ["docs_read", "docs_search"]  # named as verifiers names them
    params = {t["function"]["name"]: t["function"]["parameters"] for t in env.tools()}
    assert params["docs_read"]["required"] == ["doc_id"]
    task = env.tasks("train")[0]
    assert task.id == "calendar-first-day" and task.answer == "Monday"
    assert [e.text for e in env.answer_evidence(task)] == [
        "these calendars have Monday as the first day of the week"
    ]
    s = env.session(task)
    assert s.call("docs_search", {"query": "calendar first day"}).startswith("[calendar]")
    assert "Monday" in s.call("docs_read", {"doc_id": "calendar"})
    assert s.call("docs_read", {"doc_id": "nope"}).startswith("Error:")
    assert s.call("read", {"doc_id": "calendar"}).startswith("Error: unknown tool")
    # the score is the task's own reward (normalised exact match), not acmrl's metric
    assert env.score(task, "monday.") == 1.0 and env.score(task, "Monday is first") == 0.0
    assert env.score(task, None) == 0.0
    with pytest.raises(NotImplementedError, match="no expert plan"):
        env.oracle_plan(task)


def test_splits_limit_and_bad_options_are_named(tmp_path):
    with pytest.raises(EnvError, match="cannot load the taskset 'no_such_taskset'"):
        load("verifiers", taskset="no_such_taskset", path=ENVS)
    with pytest.raises(EnvError, match=r"(?s)bad config for the taskset 'docs_qa'.*tasks_fil"):
        load("verifiers", taskset="docs_qa", path=ENVS, config={"tasks_fil": "x"})
    with pytest.raises(EnvError, match=r"path .* is not a folder"):
        load("verifiers", taskset="docs_qa", path=str(tmp_path / "missing"))
    with pytest.raises(EnvError, match=r"splits.dev is 'first'; give a slice"):
        load("verifiers", taskset="docs_qa", path=ENVS, splits={"dev": "first"})
    with pytest.raises(EnvError, match=r"split test \(5:\) holds no task of 3"):
        load("verifiers", taskset="docs_qa", path=ENVS, limit=3, splits={"test": "5:"})
    with pytest.raises(EnvError, match="splits a and b overlap"):
        load("verifiers", taskset="docs_qa", path=ENVS, splits={"a": "0:4", "b": "3:"})


def write_taskset(root: Path, name: str, body: str) -> str:
    (root / name).mkdir(parents=True)
    head = "import verifiers.v1 as vf\n\n"
    (root / name / "__init__.py").write_text(head + textwrap.dedent(body))
    return str(root)


HEAD = """
    class Data(vf.TaskData):
        answer: str = "x"
        split: str | None = None

    class Cfg(vf.TasksetConfig):
        pass

    class Plain(vf.Task[Data]):
        @vf.reward
        async def r(self, trace: vf.Trace) -> float:
            return float(trace.last_reply == self.data.answer)
"""

REFUSED = {
    "toolset_state": (
        """
        class Notes(vf.State):
            seen: int = 0

        class NotesTools(vf.Toolset[vf.ToolsetConfig, Notes]):
            @vf.tool
            def note(self) -> str:
                return "ok"

        class T(Plain):
            @classmethod
            def toolsets(cls, config):
                return [NotesTools(vf.ToolsetConfig())]

        TASKS = [T(Data(prompt="q"))]
        """,
        "NotesTools keeps per-rollout state",
    ),
    "toolset_setup_task": (
        """
        class PerTask(vf.Toolset[vf.ToolsetConfig]):
            async def setup_task(self, task):
                self.task = task

            @vf.tool
            def look(self) -> str:
                return "ok"

        class T(Plain):
            @classmethod
            def toolsets(cls, config):
                return [PerTask(vf.ToolsetConfig())]

        TASKS = [T(Data(prompt="q"))]
        """,
        "PerTask keeps per-rollout state or sets itself up per task",
    ),
    "task_setup_hook": (
        """
        class T(Plain):
            async def setup(self, trace, runtime):
                pass

        TASKS = [T(Data(prompt="q"))]
        """,
        "T defines setup, which run in the task's runtime",
    ),
    "runtime_reward": (
        """
        class T(Plain):
            @vf.reward
            async def tests_pass(self, trace: vf.Trace, runtime) -> float:
                return 1.0

        TASKS = [T(Data(prompt="q"))]
        """,
        r"reward\(s\) \['tests_pass'\] need the task's runtime",
    ),
    "no_reward": (
        """
        class T(vf.Task[Data]):
            pass

        TASKS = [T(Data(prompt="q"))]
        """,
        "T has no reward or judge to score with",
    ),
    "different_toolsets": (
        """
        class Tools(vf.Toolset[vf.ToolsetConfig]):
            @vf.tool
            def look(self) -> str:
                return "ok"

        class TC(vf.TaskConfig):
            url: str | None = None

        class T(vf.Task[Data, vf.State, TC]):
            @classmethod
            def toolsets(cls, config):
                return [Tools(vf.ToolsetConfig(url=config.url))]

            @vf.reward
            async def r(self, trace: vf.Trace) -> float:
                return 1.0

        TASKS = [T(Data(prompt="q")), T(Data(prompt="p"), TC(url="http://127.0.0.1:1/mcp"))]
        """,
        "the tasks have different toolsets",
    ),
    "partial_splits": (
        """
        TASKS = [Plain(Data(id="a", prompt="q", split="train")), Plain(Data(id="b", prompt="p"))]
        """,
        r"1 task\(s\) have no split field \(e.g. 'b'\)",
    ),
}


def taskset_module(body: str) -> str:
    tail = """
        class TS(vf.Taskset[vf.Task, Cfg]):
            def load(self):
                return TASKS

        __all__ = ["TS"]
    """
    return textwrap.dedent(HEAD) + textwrap.dedent(body) + textwrap.dedent(tail)


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_acmrl_cannot_run_is_refused_with_the_reason(tmp_path, case):
    body, message = REFUSED[case]
    path = write_taskset(tmp_path, f"vf_{case}", taskset_module(body))
    with pytest.raises(EnvError, match=message):
        load("verifiers", taskset=f"vf_{case}", path=path)


def test_an_infinite_taskset_needs_a_limit(tmp_path):
    body = """
        class TS(vf.Taskset[Plain, Cfg]):
            INFINITE = True

            def load(self):
                i = 0
                while True:
                    yield Plain(Data(id=f"t{i}", prompt=f"say x ({i})"))
                    i += 1

        __all__ = ["TS"]
    """
    path = write_taskset(tmp_path, "vf_endless", textwrap.dedent(HEAD) + textwrap.dedent(body))
    with pytest.raises(EnvError, match=r"is infinite; set env\.options\.limit"):
        load("verifiers", taskset="vf_endless", path=path)
    # bounded by limit, with no toolset: a taskset of prompts and a rubric alone
    e = load("verifiers", taskset="vf_endless", path=path, limit=3)
    assert [t.id for t in e.tasks("eval")] == ["t0", "t1", "t2"] and e.tools() == []
    assert e.score(e.tasks("eval")[1], "x") == 1.0 and e.score(e.tasks("eval")[1], "y") == 0.0


def test_rewards_see_the_tasks_state_and_prompt_and_a_failing_one_marks_the_episode(tmp_path):
    body = """
        class Seen(vf.State):
            calls: int = 0

        class T(vf.Task[Data, Seen]):
            @vf.reward
            async def r(self, trace: vf.Trace) -> float:
                first = trace.messages[0]
                assert type(first).__name__ == "SystemMessage" and first.content == "Be brief."
                assert trace.state.calls == 0 and trace.task.key == self.key
                if trace.last_reply == "boom":
                    raise RuntimeError("the judge is down")
                return float(trace.last_reply == self.data.answer)

        class TS(vf.Taskset[T, Cfg]):
            def load(self):
                return [T(Data(id="s", prompt="say x", system_prompt="Be brief."))]

        __all__ = ["TS"]
    """
    path = write_taskset(tmp_path, "vf_seen", textwrap.dedent(HEAD) + textwrap.dedent(body))
    e = load("verifiers", taskset="vf_seen", path=path)
    (task,) = e.tasks("eval")
    assert task.prompt == "Be brief.\n\nsay x"
    assert e.score(task, "x") == 1.0 and e.score(task, "y") == 0.0
    with pytest.warns(UserWarning, match="a reward failed .*the judge is down"):
        assert e.score(task, "boom") == 0.0
    s = e.session(task)
    s.call("answer", {"text": "boom"})
    with pytest.warns(UserWarning, match="episode marked"):
        assert s.score() == 0.0
    assert s.incidents and "the judge is down" in s.incidents[0]


def eval_config(tmp_path: Path) -> EvalConfig:
    cfg = EvalConfig(output=str(tmp_path / "eval"), arms=["react", "acm"], machine="test CPU")
    cfg.env.name = "verifiers"
    cfg.env.options = {"taskset": "docs_qa", "path": ENVS}
    cfg.env.limit = 2
    cfg.agent.max_context_tokens = 4096
    cfg.agent.max_turns = 6
    return cfg


def test_acmrl_eval_runs_the_verifiers_environment_in_react_and_acm(tmp_path, tokenizer, env):
    cfg = eval_config(tmp_path)
    tasks = {t.prompt: t.answer for t in env.tasks("eval")}
    report = run_eval(cfg, engine=ScriptedEngine(tokenizer, reader(tasks, prefix="docs_")))
    check_reader_eval(report, tmp_path / "eval")
    # a wrong answer scores 0 by the rubric
    wrong = {q: "no idea" for q in tasks}
    cfg.output = str(tmp_path / "eval-wrong")
    report = run_eval(cfg, engine=ScriptedEngine(tokenizer, reader(wrong, prefix="docs_")))
    assert report["arms"]["react"]["pass@1"] == 0.0


def test_the_cli_evaluates_a_model_on_the_verifiers_environment_in_every_arm(
    tmp_path, tiny_model_dir
):
    env = ["env.name=verifiers", f"env.options={{taskset: docs_qa, path: {ENVS}}}"]
    cli_eval_every_arm(tmp_path / "cli", tiny_model_dir, env)


def test_a_killed_toolset_server_is_restarted_and_the_episode_marked(tmp_path, tokenizer, env):
    cfg = eval_config(tmp_path)
    cfg.arms, cfg.env.limit = ["react"], 1
    tasks = {t.prompt: t.answer for t in env.tasks("eval")}

    before = servers()  # the module fixture's server stays up

    def kill() -> None:
        for p in servers() - before:
            p.kill()

    report = run_eval(cfg, engine=ScriptedEngine(tokenizer, reader(tasks, kill, "docs_")))
    (traj,) = read_trajectories(tmp_path / "eval" / "episodes.jsonl")
    assert traj.metrics["env_incidents"] == 1
    assert traj.status == "answered" and report["arms"]["react"]["pass@1"] == 1.0
    read = [o for s in traj.steps for o in s.observations if "Each instance" in o]
    assert read, "the read after the kill reached the restarted server"


def test_audit_searches_with_the_toolsets_search_tool(tmp_path, tiny_model_dir):
    """Without a plan, the audit's first_result finds verifiers' prefixed search tool
    (``docs_search``) and answers with the first title it lists."""
    from acmrl.config import AuditConfig
    from acmrl.eval.audit import run_audit

    cfg = AuditConfig(output=str(tmp_path / "audit"), trivial=["first_result"])
    cfg.model.name = str(tiny_model_dir)
    cfg.env.name, cfg.env.options, cfg.env.limit = "verifiers", {"taskset": "docs_qa"}, 2
    cfg.env.options["path"] = ENVS
    cfg.agent.max_turns, cfg.model_tokens = 2, 8
    report = run_audit(cfg)
    rows = {r["strategy"]: r for r in report["strategies"]}
    assert rows["first_result"]["tool_calls"] == 2  # it searched, then answered
    firsts = [
        json.loads(line)
        for line in (tmp_path / "audit" / "episodes.jsonl").read_text().splitlines()
        if "#first_result" in line
    ]
    docs = {p.stem for p in (Path(ENVS).parent / "mcp_docs").glob("*.md")}
    assert len(firsts) == 2 and all(t["answer"] in docs for t in firsts)


def test_a_reward_that_reads_the_rollouts_turns_is_named_at_load(tmp_path):
    body = """
        class T(Plain):
            @vf.reward
            async def few_calls(self, trace: vf.Trace) -> float:
                return float(len(trace.tool_messages) <= 3)

        TASKS = [T(Data(prompt="q"))]
    """
    path = write_taskset(tmp_path, "vf_turns", taskset_module(body))
    with pytest.warns(UserWarning, match=r"T's reward\(s\) \['few_calls'\] read the rollout's"):
        e = load("verifiers", taskset="vf_turns", path=path)
    # it still scores, on the two-message trace: the inherited answer reward 1, and few_calls 1
    # (it sees no tool message at all)
    assert e.score(e.tasks("eval")[0], "x") == 2.0


def test_annotate_splices_a_valid_llm_edit_into_the_verifiers_environment(tmp_path, tiny_model_dir):
    """The LLM teacher on a verifiers environment: the taskset's answers and evidence in its
    prompt, corrections calling the toolset's prefixed search tool, resumed through the
    toolset's server; then SFT on the dataset and a GRPO step from it on the environment."""
    env = ("verifiers", {"taskset": "docs_qa", "path": ENVS})
    annotate_with_a_served_valid_teacher(tmp_path, tiny_model_dir, env, "docs_search")
    # and on: SFT on that dataset, then GRPO from the SFT adapter with rollouts on the
    # environment (its toolset served, its rubric the reward)
    from acmrl.config import GRPOConfig, SFTConfig
    from acmrl.train.grpo import run_grpo
    from acmrl.train.sft import run_sft

    sft = SFTConfig(dataset=str(tmp_path / "annotate" / "dataset"), output=str(tmp_path / "sft"))
    sft.model.name, sft.lora.r, sft.log_with = str(tiny_model_dir), 4, []
    sft.optim.max_steps, sft.optim.batch_tokens = 2, 2048
    assert run_sft(sft)["steps"] == 2
    grpo = GRPOConfig(output=str(tmp_path / "grpo"), log_with=[], save_rollouts=False)
    grpo.model.name = str(tmp_path / "sft" / "final")
    grpo.env.name, grpo.env.options = env
    grpo.env.split, grpo.arms, grpo.group_size, grpo.tasks_per_step = "train", ["react"], 2, 1
    grpo.agent.max_turns, grpo.sampling.max_new_tokens, grpo.optim.max_steps = 2, 8, 1
    result = run_grpo(grpo)
    assert result["steps"] == 1 and (tmp_path / "grpo" / "final").exists()
