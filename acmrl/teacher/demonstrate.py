"""Expert demonstrations: whole episodes in which the oracle teacher writes every policy turn.

An untrained small student makes no valid tool call (FACTS.md), so one correction per run teaches
it one call: the student falls back to plain text right after the edit. A demonstration gives
the supervised warm start the rest of the pipeline needs: the agent loop, the environment and
the context tools run for real, and every policy turn is the teacher's: a first-person rationale
and the call, in the exact rendering the student reads. Each turn is chosen from what the agent
has seen so far, as the oracle's corrections are:

- with context tools (``acm``, ``evolve``), when the input reaches ``pressure`` x budget and
  nothing was compacted since the last environment call, the teacher compacts (``manage_context``,
  or an ``evolve`` that keeps the documents' fact sentences), as its injections do;
- otherwise the next call of the expert's plan that is still needed; at the end, ``answer``.

``manage_context`` needs a summary: the teacher writes it too (the task's hop facts the agent has
read, and the documents it opened), so nothing of the episode comes from a model. Every policy
step is marked ``teacher``: in the training samples all its tokens, and the notes it wrote as
the summariser, are targets, weighted by the demonstration's outcome (a failed one teaches
nothing by default; :mod:`acmrl.train.samples`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from acmrl.config import AgentConfig, SamplingConfig
from acmrl.context.render import format_tool_call
from acmrl.engines.scripted import ScriptedEngine
from acmrl.envs.base import Environment, Task
from acmrl.rollout.agent import Episode
from acmrl.rollout.records import Trajectory
from acmrl.rollout.worker import run_episodes
from acmrl.teacher.oracle import EVOLVE_KEEP_FACTS, _describe, _facts_seen, _next_needed

_SIGNAL = re.compile(r"\[context: (\d+) of \d+ tokens\]")


class Demonstrator:
    """The oracle's reply function for one demonstration episode (policy and summariser)."""

    def __init__(
        self, env: Environment, task: Task, arm: str, budget: int, tokenizer: Any, pressure: float
    ) -> None:
        self.env, self.task, self.arm, self.budget = env, task, arm, budget
        self.tok, self.pressure = tokenizer, pressure
        self.seen = task.prompt  # everything read so far (kept across compactions)
        self.done: list[tuple[str, str]] = []
        self.compacted = False  # a compaction since the last environment call

    def __call__(self, session_id: str, prompt: str) -> str:
        if session_id.endswith("/summariser"):
            return self._notes()
        if session_id.endswith("/querier"):
            return "No archived facts were needed."
        self.seen += "\n" + prompt
        # the size the agent sees when the harness signals it (agent.context_signal), else the
        # size of the input itself
        signals = _SIGNAL.findall(prompt)
        n = int(signals[-1]) if signals else len(self.tok.encode(prompt, add_special_tokens=False))
        if (
            self.arm in ("acm", "evolve")
            and n >= self.pressure * self.budget
            and not self.compacted
            and self.done
        ):
            self.compacted = True
            facts = _facts_seen(self.task, self.seen)
            said = " ".join(f.rstrip(".") + "." for f in facts)
            keep = f", and I must keep what I still need: {said}" if facts else "."
            why = f"My context is at {n} of {self.budget} tokens and I have more to read{keep}"
            if self.arm == "acm":
                return self._turn(
                    f"{why} I will compact my earlier steps before I continue.",
                    "manage_context",
                    {},
                )
            return self._turn(
                f"{why} I will cut the documents I have read down to their facts.",
                "evolve",
                {"code": EVOLVE_KEEP_FACTS},
            )
        name, args = _next_needed(self.env, self.task, self.seen, self.done)
        self.done.append((name, json.dumps(args, sort_keys=True)))
        self.compacted = False
        return self._turn(_describe(name, args), name, args)

    @staticmethod
    def _turn(rationale: str, name: str, args: dict[str, Any]) -> str:
        return f"{rationale}\n{format_tool_call(name, args)}"

    def _notes(self) -> str:
        facts = [
            f
            for f in self.task.metadata.get("facts", [])
            if f.split(" is ")[-1].rstrip(".") in self.seen
        ]
        opened = [json.loads(a)["doc_id"] for n, a in self.done if n == "open"]
        lines = [f"- {f[0].upper()}{f[1:]}" for f in facts]
        if opened:
            lines.append(f"- Documents read: {', '.join(opened)}.")
        return "\n".join(lines) or "- Nothing needed has been found yet."


def demonstrate(
    env: Environment,
    tasks: list[Task],
    arms: list[str],
    tokenizer: Any,
    *,
    agent: AgentConfig,
    sampling: SamplingConfig,
    pressure: float = 0.6,
    concurrency: int = 16,
) -> list[Trajectory]:
    """One demonstration per task and arm, run through the real agent loop; all policy turns are
    marked as the teacher's."""
    episodes, demos = [], {}
    for task in tasks:
        for arm in arms:
            ep = Episode(
                f"{task.id}#{arm}#demo", env, task, arm, tokenizer, agent=agent, sampling=sampling
            )
            episodes.append(ep)
            demos[ep.id] = Demonstrator(env, task, arm, ep.budget, tokenizer, pressure)

    def reply(session_id: str, prompt: str) -> str:
        episode = session_id.removesuffix("/summariser").removesuffix("/querier")
        return demos[episode](session_id, prompt)

    engine = ScriptedEngine(tokenizer, reply, truncate=False)
    run_episodes(episodes, engine, concurrency=concurrency)
    out = []
    for ep in episodes:
        for step in ep.traj.steps:
            if step.call is not None and step.call.role == "policy":
                step.call.role, step.origin = "teacher", "teacher"
                step.call.logprobs = []
        ep.traj.edit = {
            "source": "",
            "step": 0,
            "kind": "demonstration",
            "action": None,
            "rationale": "",
            "teacher": "oracle",
        }
        out.append(ep.traj)
    return out
