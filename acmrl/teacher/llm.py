"""The LLM teacher: any engine (a strong model behind an OpenAI-compatible server on a cluster, or
the transformers engine locally) writes the assessment as JSON.

The prompt shows the task, the reference answer, the budget, the agent's tools and its numbered
steps (what it wrote, the calls, the results, the context size at each step). The reply is parsed
robustly (code fences and prose around the object are ignored) and checked by the validators; a
reply that is not JSON or fails a validator is retried with the reasons, up to ``max_attempts``,
and then recorded as a failed assessment, never silently dropped.

With ``structured`` (the default) each request also carries the reply's JSON schema as OpenAI's
``response_format`` (:func:`assessment_schema`: the kinds, the trajectory's step numbers, a
rationale that starts with "I" and has 8 to 120 words, and one of the agent's tools with its own
argument schema; an injection's action is a context tool). vLLM and ``acmrl serve`` then emit
only replies of that shape, so even a small model's reply parses unless it is cut at
``max_tokens`` (the retry is told so). Where a value would be refused whatever the wording, the
schema leaves it out: ``query_memory`` names a summary that exists at its step, an ``answer``
call gives the reference answer (a single one). It is stricter than the validators in one way,
the rationale's first word "I"; the validators still decide whether it is a valid edit.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable
from typing import Any

from acmrl.engines.base import Engine, Request
from acmrl.engines.structured import json_schema_format
from acmrl.envs.base import ANSWER_TOOL, Task
from acmrl.rollout.records import Trajectory
from acmrl.teacher.assessment import (
    CONTEXT_ACTIONS,
    KINDS,
    MAX_WORDS,
    MIN_WORDS,
    Assessment,
    seen_text,
    summaries_before,
    validate,
)

TEACHER_PROMPT = """You review an AI agent's attempt at a task, to teach it when and how to manage its context.

Task: {task}
Reference answer: {reference}{evidence}
The agent's context budget: {budget} tokens (system prompt and tools included).
The agent's tools: {tools}

The agent's steps:
{steps}

Choose ONE edit:
- "injection": the earliest step at which a context action (manage_context; query_memory with a
  query; evolve with JavaScript code) would have helped; the agent's turn there is replaced by it.
- "correction": the first unproductive step (a repeated or irrelevant call, an answer before the
  evidence was read) and the productive call to make there instead.
- "no_action": nothing to change.

The rationale is the agent's own thinking at that step, in the first person, 8 to 120 words,
using only what the agent had seen before that step. Never reveal the reference answer unless the
agent had already seen it; never mention a teacher, coach, reviewer or feedback.

Reply with JSON only:
{{"kind": "injection" | "correction" | "no_action", "step": <step number>, "rationale": "<first person>", "action": {{"name": "<tool>", "arguments": {{...}}}}}}"""

RETRY = "Your reply was rejected: {errors}. Reply again with JSON only."


def parse_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (inside a code fence or not); ValueError if none."""
    fenced = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.S)
    candidates = [fenced.group(1)] if fenced else []
    start = text.find("{")
    while start != -1:
        depth, in_str, esc = 0, False, False
        for i in range(start, len(text)):
            ch = text[i]
            if in_str:
                esc = ch == "\\" and not esc
                if ch == '"' and not esc:
                    in_str = False
                continue
            if ch == '"':
                in_str = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    candidates.append(text[start : i + 1])
                    break
        start = text.find("{", start + 1)
    for c in candidates:
        try:
            obj = json.loads(c)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    raise ValueError("the reply holds no JSON object")


def assessment_schema(
    n_steps: int,
    tools: list[dict[str, Any]],
    summaries: list[set[str]] | None = None,
    answers: list[str] | None = None,
) -> dict[str, Any]:
    """The JSON schema of a reply about a trajectory of ``n_steps`` policy steps, whose agent
    has ``tools`` (OpenAI function schemas): ``no_action``, or an edit at one of its steps with
    a first-person rationale and a call of one of its tools (a context tool for an injection).
    Where the validators would refuse a value whatever the wording, the schema leaves it out:
    given ``summaries`` (the ids archived before each step), ``query_memory`` names one of those
    at its step and is left out where there is none; given ``answers`` (the reference answers),
    an ``answer`` call gives one of them."""
    rationale = {
        "type": "string",
        # the first word is "I"; MIN_WORDS to MAX_WORDS words (of at most 40 characters) in all
        "pattern": rf"^I( \S{{1,40}}){{{MIN_WORDS - 1},{MAX_WORDS - 1}}}$",
    }

    def call(fn: dict[str, Any], ids: frozenset[str] | None) -> dict[str, Any] | None:
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        pinned = {"query_memory": ("summary_id", ids), ANSWER_TOOL: ("text", answers)}
        field, values = pinned.get(fn["name"], ("", None))
        if values is not None:
            if not values:
                return None  # nothing it could validly name here
            props = {**params.get("properties", {}), field: {"enum": sorted(values)}}
            params = {**params, "properties": props}
        return {
            "type": "object",
            "properties": {"name": {"const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }

    def edit(kind: str, steps: list[int], fns: list[dict[str, Any]], ids: Any) -> Any:
        calls = [c for f in fns if (c := call(f, ids)) is not None]
        if not steps or not calls:
            return None
        return {
            "type": "object",
            "properties": {
                "kind": {"const": kind},
                "step": {"enum": steps},
                "rationale": rationale,
                "action": {"anyOf": calls},
            },
            "required": ["kind", "step", "rationale", "action"],
            "additionalProperties": False,
        }

    fns = [t["function"] for t in tools]
    context = [f for f in fns if f["name"] in CONTEXT_ACTIONS]
    # the steps grouped by the summaries that exist there (one group when they are not given)
    groups: dict[frozenset[str] | None, list[int]] = {}
    for k in range(n_steps):
        groups.setdefault(frozenset(summaries[k]) if summaries else None, []).append(k)
    variants = [
        v
        for kind, kinds_fns in (("injection", context), ("correction", fns))
        for ids, steps in groups.items()
        if (v := edit(kind, steps, kinds_fns, ids)) is not None
    ]
    variants.append(
        {
            "type": "object",
            "properties": {"kind": {"const": "no_action"}},
            "required": ["kind"],
            "additionalProperties": False,
        }
    )
    return {"anyOf": variants}


def _policy_steps(traj: Trajectory) -> int:
    """The number of the agent's own turns, which an edit's ``step`` counts."""
    return sum(1 for s in traj.steps if s.call is not None and s.call.role == "policy")


def _steps_text(traj: Trajectory, max_chars: int) -> str:
    lines = []
    n = 0
    for s in traj.steps:
        if s.call is None or s.call.role != "policy":
            for e in s.events:
                lines.append(
                    f"  (harness: {e.kind}, context {e.tokens_before} -> {e.tokens_after} tokens)"
                )
            continue
        lines.append(
            f"Step {n} [context {len(s.call.prompt_ids)} tokens]: {s.text.strip()[:max_chars]}"
        )
        for obs in s.observations:
            lines.append(f"  result: {obs[:max_chars]}")
        for err in s.errors:
            lines.append(f"  error: {err[:max_chars]}")
        n += 1
    lines.append(f"Outcome: {traj.status}, answer {traj.answer!r}, score {traj.score}")
    return "\n".join(lines)


class LLMTeacher:
    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        name: str = "llm",
        max_attempts: int = 3,
        max_tokens: int = 400,
        max_chars: int = 600,
        known_names: set[str] | None = None,
        evidence: Callable[[Task], list[tuple[str, str]]] | None = None,
        excerpt_chars: int = 500,
        structured: bool = True,
        temperature: float = 0.0,
        seed: int = 0,
        score: Callable[[Task, str], float] | None = None,
        needed: Callable[[Task], list[str]] | None = None,
    ) -> None:
        """``evidence(task)``: the gold documents' ``(id, text)`` pairs the answer rests on
        (:func:`gold_evidence`); the prompt shows an excerpt of each, as the ACM reference's
        teacher sees them beside the reference answer."""
        self.engine, self.tokenizer, self.name = engine, tokenizer, name
        self.evidence, self.excerpt_chars = evidence, excerpt_chars
        self.max_attempts, self.max_tokens, self.max_chars = max_attempts, max_tokens, max_chars
        self.known_names = known_names or set()
        self.structured, self.temperature, self.seed = structured, temperature, seed
        self.score = score  # the environment's score of an answer: an answer edit must score 1
        self.needed = needed  # what an evolve edit must keep if the State holds it

    def _evidence_text(self, task: Task) -> str:
        docs = self.evidence(task) if self.evidence else []
        if not docs:
            return ""
        lines = ["", "Gold evidence (excerpts; the agent sees a document only once it opens it):"]
        for doc_id, text in docs:
            flat = " ".join(text.split())
            cut = flat[: self.excerpt_chars] + (" ..." if len(flat) > self.excerpt_chars else "")
            lines.append(f"- [{doc_id}] {cut}")
        return "\n".join(lines)

    def _ids(self, messages: list[dict[str, str]]) -> list[int]:
        return list(
            self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )

    def assess(
        self,
        task: Task,
        traj: Trajectory,
        budget: int,
        tools: list[dict[str, Any]],
        state_at: Callable[[int], list[dict[str, Any]]] | None = None,
    ) -> Assessment:
        """One validated assessment of ``traj`` (retried with the errors up to ``max_attempts``);
        ``state_at(step)`` gives the student's State at a step, on which an ``evolve`` edit's
        code is run during validation."""
        tool_list = ", ".join(t["function"]["name"] for t in tools)
        ref = task.answer if isinstance(task.answer, str) else " | ".join(task.answer)
        prompt = TEACHER_PROMPT.format(
            task=task.prompt,
            reference=ref,
            evidence=self._evidence_text(task),
            budget=budget,
            tools=tool_list,
            steps=_steps_text(traj, self.max_chars),
        )
        messages = [{"role": "user", "content": prompt}]
        n_steps = _policy_steps(traj)
        summaries = [summaries_before(traj, k) for k in range(n_steps)]
        # a single reference answer pins an answer call; an answer set is left to the score
        answers = [task.answer] if isinstance(task.answer, str) else None
        schema = assessment_schema(n_steps, tools, summaries, answers) if self.structured else None
        errors: list[str] = []
        for attempt in range(1, self.max_attempts + 1):
            req = Request(
                f"teacher/{traj.episode_id}/{attempt}",
                self._ids(messages),
                self.max_tokens,
                self.temperature,
                seed=zlib.crc32(f"{self.seed}/{traj.episode_id}/{attempt}".encode()),
            )
            if schema is not None:
                req.response_format = json_schema_format("assessment", schema)
            out = self.engine.generate([req])[0]
            reply = out.text
            self.engine.release(req.session_id)
            a, errors = self._check(reply, task, traj, tools, state_at)
            if errors and out.finish_reason == "length":
                errors.append(f"the reply was cut at {self.max_tokens} tokens: write a shorter one")
            if not errors:
                a.attempts = attempt
                return a
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": RETRY.format(errors="; ".join(errors))},
            ]
        return Assessment(
            "no_action", teacher=self.name, valid=False, errors=errors, attempts=self.max_attempts
        )

    def _check(
        self,
        reply: str,
        task: Task,
        traj: Trajectory,
        tools: list[dict[str, Any]],
        state_at: Callable[[int], list[dict[str, Any]]] | None = None,
    ) -> tuple[Assessment, list[str]]:
        try:
            obj = parse_json_object(reply)
        except ValueError as exc:
            return Assessment("no_action", teacher=self.name), [str(exc)]
        kind = obj.get("kind")
        if kind not in KINDS:
            return Assessment("no_action", teacher=self.name), [
                f"kind must be one of {', '.join(KINDS)}"
            ]
        n_steps = _policy_steps(traj)
        step = obj.get("step", -1)
        if kind != "no_action" and not (isinstance(step, int) and 0 <= step < n_steps):
            return Assessment("no_action", teacher=self.name), [
                f"step must be an integer from 0 to {n_steps - 1}"
            ]
        a = Assessment(
            kind,
            step if kind != "no_action" else -1,
            obj.get("action"),
            str(obj.get("rationale", "")),
            self.name,
        )
        seen = seen_text(traj, a.step) if kind != "no_action" else ""
        evolve = isinstance(a.action, dict) and a.action.get("name") == "evolve"
        return a, validate(
            a,
            seen=seen,
            reference=task.answer,
            tools=tools,
            known_names=self.known_names,
            state=state_at(a.step) if evolve and state_at is not None else None,
            needed=self.needed(task) if evolve and self.needed else None,
            score=(lambda text: self.score(task, text)) if self.score else None,
            summaries=summaries_before(traj, a.step),
        )


def gold_evidence(env: Any) -> Callable[[Task], list[tuple[str, str]]]:
    """What a task's answer rests on, for the teacher's prompt: the gold documents
    (``task.metadata["gold_docs"]``) in an environment that holds documents (kb_search,
    corpus_qa), else the evidence sentences a task file gives (``task.metadata["evidence"]``,
    e.g. an MCP environment's JSONL tasks); an empty list (no section) when there is neither."""
    docs = {d.id: d for d in getattr(env, "documents", None) or []}

    def evidence(task: Task) -> list[tuple[str, str]]:
        ids = task.metadata.get("gold_docs") or []
        found = [(i, f"{docs[i].title}: {docs[i].text}") for i in ids if i in docs]
        given = task.metadata.get("evidence") or []
        return found or [(f"evidence {n}", str(text)) for n, text in enumerate(given, 1)]

    return evidence
