"""The agent loop: one episode as an explicit state machine over the State of ``acmrl/context``.

Phases, one handler each:

- ``generate``: render the State (system prompt and tools included), check the budget, let the
  ``summary`` arm's monitor fire, and ask for a policy completion;
- ``tools``: run the parsed calls one by one: environment tools through the session, ``answer``,
  and the arm's context tools (``manage_context`` and ``query_memory`` need a summariser or querier
  model call; ``evolve`` runs in the sandbox);
- ``summarise``: the ``summary`` arm's monitor, which replaces the history by a summary;
- ``done``: the trajectory is complete.

The loop never talks to an engine: ``next_request()`` advances until a model call is needed and
returns it, ``receive(completion)`` resumes. The worker batches the requests of many episodes.
Every model call is recorded with its token ids, logprobs and the prefix the engine reused; every
context event with the cost figures of DESIGN.md.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from acmrl.config import ARMS, AgentConfig, SamplingConfig
from acmrl.context.archive import Archive, ArchiveError
from acmrl.context.evolve import EVOLVE_TOOL_SCHEMA, STATE_PROMPT, EvolveLimits, apply_evolve
from acmrl.context.prefix import compaction_cost, reusable_prefix
from acmrl.context.render import Renderer, ToolCall, parse_completion, text_call
from acmrl.context.state import (
    EVOLVE_TOOL,
    State,
    assistant,
    function_call,
    function_call_output,
    output_text,
    user,
)
from acmrl.engines.base import Completion, Request
from acmrl.envs.base import ANSWER_TOOL, Environment, Task
from acmrl.rollout import prompts
from acmrl.rollout.records import ContextEvent, ModelCall, Step, Trajectory, terms_kept

MiB = 1024 * 1024


class Episode:
    """One task, one arm, one sample."""

    def __init__(
        self,
        episode_id: str,
        env: Environment,
        task: Task,
        arm: str,
        tokenizer: Any,
        *,
        agent: AgentConfig,
        sampling: SamplingConfig,
        sample: int = 0,
        seed: int = 0,
        model: str = "",
        sample_helpers: bool = False,
    ) -> None:
        if arm not in ARMS:
            raise ValueError(f"unknown arm {arm!r}; arms: {', '.join(ARMS)}")
        self.id, self.env, self.task, self.arm = episode_id, env, task, arm
        self.agent, self.sampling, self.seed = agent, sampling, seed
        # helper calls that are trained (GRPO's train_helpers) must be sampled from the policy,
        # as its turns are; otherwise they are greedy
        self.sample_helpers = sample_helpers
        self.budget = prompts.context_budget(agent, env)
        self.session = env.session(task)
        self.tools = arm_tools(self.session.tools, arm)
        system = prompts.system_prompt(arm, self.budget, STATE_PROMPT)
        self.renderer = Renderer(tokenizer, system, self.tools)
        self.helper_renderer = Renderer(tokenizer, None, [])
        self.state: State = [user(task.prompt)]
        self.archive = Archive() if arm == "acm" else None
        self.memory = ""  # the memory arm's external store (what the reflections kept)
        self._raw: list[str] = []  # memory arm: call ids whose raw results are still in context
        self.phase = "generate"
        self.turn = 0
        self.queue: list[ToolCall] = []
        self.last_input: list[int] = []  # the last policy prompt + completion: what is cached
        self._pending: list[_Pending] = []  # context events waiting for the next input
        # environment call -> (turn, call id) of its latest run
        self._env_calls: dict[tuple[str, str], tuple[int, str]] = {}
        self._key_terms: list[str] | None = None  # env.key_terms(task), at the first summary
        self._resume: Callable[[Completion], None] | None = None
        self.pending_role = "policy"
        self._step: Step | None = None
        self.traj = Trajectory(
            episode_id, task.id, env.name, arm, sample, seed, model, task.prompt, task.answer
        )

    @property
    def done(self) -> bool:
        return self.phase == "done"

    # -- driving ----------------------------------------------------------------------------------

    def next_request(self) -> Request | None:
        """Advance until a model call is needed (returned) or the episode is over (None)."""
        while self.phase != "done" and self._resume is None:
            try:
                request = getattr(self, f"_on_{self.phase}")()
            except Exception as exc:  # a bug in a tool must end this episode, not the run
                self.finish("error", f"{type(exc).__name__}: {exc}")
                return None
            if request is not None:
                return request
        return None

    def receive(self, completion: Completion) -> None:
        resume, self._resume = self._resume, None
        if resume is None:
            raise RuntimeError(f"episode {self.id} received a completion it did not ask for")
        try:
            resume(completion)
        except Exception as exc:
            self.finish("error", f"{type(exc).__name__}: {exc}")

    def fail(self, message: str) -> None:
        """The engine could not serve this episode's request."""
        self._resume = None
        self.finish("error", message)

    def finish(self, status: str, error: str | None = None) -> None:
        self.phase = "done"
        if self._pending and status != "error":
            # the episode ends before another input is sent: the edit is charged against the
            # input it would have been, never free
            self._settle(self.renderer.ids(self.state))
        t = self.traj
        t.status, t.error = status, error
        t.answer = self.session.answer
        t.score = self.session.score() if status == "answered" else 0.0
        t.final_state = self.state
        t.compute_metrics()
        t.metrics["budget"] = self.budget
        t.metrics["forced_compactions"] = sum(
            e.detail.startswith("forced") for s in t.steps for e in s.events
        )
        if self.archive is not None:
            self.archive.close()

    def _ask(self, role: str, ids: list[int], max_tokens: int, resume: Callable) -> Request:
        self._resume = resume
        self.pending_role = role  # the worker sends policy calls and helper calls to their engines
        suffix = "" if role == "policy" else f"/{role}"
        return Request(
            session_id=self.id + suffix,
            prompt_ids=ids,
            max_tokens=max_tokens,
            temperature=self.sampling.temperature
            if role == "policy" or self.sample_helpers
            else 0.0,
            top_p=self.sampling.top_p,
            stop=list(self.sampling.stop) if role == "policy" else [],
            seed=(self.seed * 100_003 + self.turn * 7 + len(self.traj.steps)) % (1 << 62),
        )

    @staticmethod
    def _record(role: str, req_ids: list[int], c: Completion) -> ModelCall:
        return ModelCall(
            role,
            req_ids,
            c.completion_ids,
            c.logprobs,
            c.cached_prefix_tokens,
            c.finish_reason,
            c.wall_s,
        )

    # -- generate ---------------------------------------------------------------------------------

    def _on_generate(self) -> Request | None:
        if self.turn >= self.agent.max_turns:
            self.finish("max_turns")
            return None
        ids = self.renderer.ids(self.state)
        if (
            self.arm == "summary"
            and len(ids) >= self.agent.summary_threshold * self.budget
            and len(self.state) > 2
        ):
            self.phase = "summarise"
            return None
        force = self.agent.force_compaction
        if (
            self.arm == "acm"
            and force is not None
            and len(ids) >= force * self.budget
            and self._boundary() < len(self.state)
        ):
            self.phase = "force_compact"
            return None
        if len(ids) > self.budget and self.agent.on_overflow == "force_answer":
            return self._force_answer(len(ids))
        self._settle(ids)
        if len(ids) > self.budget:
            self.finish("overflow", f"the input has {len(ids)} tokens; the budget is {self.budget}")
            return None
        return self._ask(
            "policy", ids, self.sampling.max_new_tokens, lambda c: self._after_policy(ids, c)
        )

    # -- overflow rules ---------------------------------------------------------------------------

    def _force_answer(self, size: int) -> Request | None:
        """``agent.on_overflow: force_answer``: drop the oldest steps (each call with its result)
        until the input and a request for the final answer fit the budget, then ask once."""
        note = user(
            f"Your context reached {size} tokens, over its budget of {self.budget}, so your "
            "oldest steps were dropped. Give your final answer now with the answer tool."
        )
        state = list(self.state)
        ids = self.renderer.ids([*state, note])
        while len(ids) > self.budget and len(state) > 1:
            item = state.pop(1)  # the task stays first
            if item["type"] == "function_call":
                state = [
                    x
                    for x in state
                    if not (x["type"] == "function_call_output" and x["call_id"] == item["call_id"])
                ]
            ids = self.renderer.ids([*state, note])
        if len(ids) > self.budget:
            self._settle(ids)
            self.finish("overflow", f"even the task alone is over the budget of {self.budget}")
            return None
        self.state = [*state, note]
        self._settle(ids)
        return self._ask(
            "policy", ids, self.sampling.max_new_tokens, lambda c: self._after_forced(ids, c)
        )

    def _after_forced(self, ids: list[int], c: Completion) -> None:
        """The reply to the forced-answer request: its answer call (or plain reply) is the
        answer; anything else ends the episode 'overflow'."""
        self.last_input = ids + c.completion_ids
        parsed = parse_completion(c.text, self.tools)
        step = Step(self.turn, self._record("policy", ids, c), c.text)
        self.traj.steps.append(step)
        step.errors = [e.observation() for e in parsed.errors]
        answer = next((k for k in parsed.calls if k.name == ANSWER_TOOL), None)
        if answer is not None:
            step.actions.append({"name": answer.name, "arguments": answer.arguments})
            self.session.call(ANSWER_TOOL, answer.arguments)
        elif not parsed.calls and not step.errors and c.finish_reason == "stop" and c.text.strip():
            self.session.call(ANSWER_TOOL, {"text": c.text.strip()})
        if self.session.done:
            self.finish("answered")
        else:
            self.finish("overflow", "over the budget, and no answer when asked for one")
        self.traj.metrics["forced_answer"] = 1

    def _on_force_compact(self) -> Request | None:
        """``agent.force_compaction`` (acm): the harness compacts the steps since the last
        summary, as ``manage_context`` would, and the turn goes on from the smaller input."""
        start = self._boundary()
        items = self.state[start:]
        self.phase = "generate"  # resumes there once the summary is in

        def done(summary: str, helper: ModelCall, facts: dict[str, int]) -> None:
            assert self.archive is not None
            sid = self.archive.put(items, summary)
            self.state = [*self.state[:start], prompts.summary_item(summary, sid)]
            step = Step(self.turn, None, origin="harness")
            step.helper_calls.append(helper)
            step.events.append(
                self._event(
                    "manage_context",
                    0,
                    helper,
                    summary_id=sid,
                    detail=f"forced at {self.agent.force_compaction:.0%} of the budget",
                    **facts,
                )
            )
            self.traj.steps.append(step)

        return self._summarise(items, self.state[:start], done)

    def _after_policy(self, ids: list[int], c: Completion) -> None:
        call = self._record("policy", ids, c)
        self.last_input = ids + c.completion_ids
        parsed = parse_completion(c.text, self.tools)
        self._step = step = Step(self.turn, call, c.text)
        self.traj.steps.append(step)
        step.errors = [e.observation() for e in parsed.errors]
        if self.agent.text_call_rule and not parsed.calls and not step.errors:
            as_text = text_call(c.text, self.tools)  # a call written as text is not an answer
            step.errors = [as_text.observation()] if as_text else []
        if parsed.calls:
            if parsed.text.strip():
                self.state.append(assistant(parsed.text.strip()))
        else:  # keep what the model wrote, malformed calls included, so it can see its mistake
            self.state.append(assistant(c.text.strip() or "(no reply)"))
        if parsed.calls:
            self._count_call_tokens(parsed.calls, c)
            self.queue = list(parsed.calls)
            self.phase = "tools"
            return
        if step.errors:
            self._observe_user("\n".join(step.errors))
        elif c.finish_reason == "length":
            self._observe_user(
                f"Your reply was cut off at {len(c.completion_ids)} tokens. Call one tool at a "
                "time, or call answer."
            )
        else:  # a plain reply is the final answer
            self.session.call(ANSWER_TOOL, {"text": c.text.strip() or "(no reply)"})
            self.finish("answered")

    def _observe_user(self, text: str) -> None:
        self.state.append(user(text))
        self._end_turn()

    def _end_turn(self) -> None:
        self.turn += 1
        self.phase = "generate"
        if self.agent.context_signal or (self.agent.harness_hint and self.arm in ("acm", "evolve")):
            self._annotate_last()

    def _annotate_last(self) -> None:
        n = len(self.renderer.ids(self.state))
        notes = []
        if self.agent.context_signal:
            notes.append(f"[context: {n} of {self.budget} tokens]")
        if self.agent.harness_hint and n >= self.agent.hint_threshold * self.budget:
            notes.append(f"[note: your context is {n} of {self.budget} tokens; compact it now]")
        if notes:
            last = self.state[-1]
            note = "\n" + "\n".join(notes)
            if last["type"] == "function_call_output":
                last["output"] = output_text(last) + note
            else:
                last["content"][-1]["text"] += note

    # -- tools ------------------------------------------------------------------------------------

    def _on_tools(self) -> Request | None:
        if not self.queue:
            if self.session.done:
                self.finish("answered")
            elif self._step is not None and self._step.errors:
                self._observe_user("\n".join(self._step.errors))
            else:
                self._end_turn()
            return None
        call = self.queue.pop(0)
        step = self._step
        assert step is not None
        call_id = f"call_{self.turn}_{len(step.actions)}"
        step.actions.append({"name": call.name, "arguments": call.arguments})
        self.state.append(function_call(call_id, call.name, call.arguments))
        if call.name == prompts.MANAGE_CONTEXT:
            return self._manage_context(call_id, call.tokens)
        if call.name == prompts.QUERY_MEMORY:
            return self._query_memory(call_id, call.arguments, call.tokens)
        if call.name == EVOLVE_TOOL:
            self._evolve(call)
            return None
        if call.name == prompts.READ_MEMORY:
            self._output(call_id, self.memory or "My memory is empty.")
            return None
        key = (call.name, json.dumps(call.arguments, sort_keys=True))
        if self.agent.repeat_rule and call.name != ANSWER_TOOL and self._in_view(key):
            self._output(call_id, repeated_call(call.name, self._env_calls[key][0]))
            return None
        self._env_calls[key] = (self.turn, call_id)
        obs = self.session.call(call.name, call.arguments)
        self._output(call_id, obs if isinstance(obs, str) else json.dumps(obs))
        if self.session.done:
            self.queue.clear()  # nothing runs after the answer
            return None
        if self.arm == "memory":
            return self._reflect(call_id)
        return None

    def _in_view(self, key: tuple[str, str]) -> bool:
        """Whether the result of an earlier identical environment call is still in the context
        as it was returned (not compacted, summarised, edited away or moved to memory): what
        ``agent.repeat_rule`` refuses to run again. A result the agent can no longer see is
        read again, as a person would reopen a document."""
        if key not in self._env_calls:
            return False
        call_id = self._env_calls[key][1]
        return any(
            x["type"] == "function_call_output"
            and x["call_id"] == call_id
            and not output_text(x).startswith(prompts.MOVED)
            for x in self.state
        )

    def _output(self, call_id: str, text: str) -> None:
        self.state.append(function_call_output(call_id, text))
        assert self._step is not None
        self._step.observations.append(text)

    # -- costs ------------------------------------------------------------------------------------

    def _count_call_tokens(self, calls: list[ToolCall], c: Completion) -> None:
        """Set ``call.tokens``: the completion tokens the model generated for each call, from the
        end of the previous call's block (so the prose that leads to a call counts with it) to
        the end of its own ``<tool_call>`` block."""
        decode = self.renderer.tokenizer.decode
        ids = c.completion_ids

        def tokens_until(end: int) -> int:  # fewest tokens whose text reaches char ``end``
            lo, hi = 0, len(ids)
            while lo < hi:
                mid = (lo + hi) // 2
                if len(decode(ids[:mid], skip_special_tokens=False)) >= end:
                    hi = mid
                else:
                    lo = mid + 1
            return lo

        done = 0
        for call in calls:
            upto = tokens_until(call.span[1])
            call.tokens = max(0, upto - done)
            done = max(done, upto)

    def _event(
        self,
        kind: str,
        call_tokens: int,
        helper: ModelCall | None,
        own_tokens: int = 0,
        **kw: Any,
    ) -> ContextEvent:
        """A context event whose cache figures are filled in by :meth:`_settle` on the next
        model input; its generated tokens (the call's and the helper's) and the helper's
        unreused prompt are known now."""
        gen = len(helper.completion_ids) if helper else 0
        read = len(helper.prompt_ids) - helper.cached_prefix_tokens if helper else 0
        event = ContextEvent(
            kind,
            0,
            0,
            0,
            0,
            call_tokens,
            gen + (len(helper.prompt_ids) if helper else 0),
            0.0,
            **kw,
        )
        fixed = compaction_cost(call_tokens + gen, read, self.agent.output_weight)
        self._pending.append(_Pending(event, fixed, own_tokens))
        return event

    def _settle(self, ids: list[int]) -> None:
        """Charge the pending events on ``ids``, the next model input actually sent (seed 001):
        Cache Cost = its tokens - the prefix it shares with the previous input + completion,
        receipts, other tool outputs, notes and the generation header included.

        The edits of one completion (``manage_context``, ``evolve`` applied or refused, the
        summary monitor) share that one Cache Cost: the first carries it, the others 0. A
        ``query_memory`` breaks no prefix: when no edit came with it, it is charged only the
        tokens its own output adds, not the environment's outputs of the same completion.
        """
        if not self._pending:
            return
        before = self.last_input
        prefix = reusable_prefix(before, ids)
        new = len(ids) - prefix
        edits = [p for p in self._pending if p.event.kind != "query_memory"]
        for p in self._pending:
            e = p.event
            e.tokens_before, e.tokens_after, e.reusable_prefix = len(before), len(ids), prefix
            if edits:
                e.cache_cost = new if p is edits[0] else 0
            else:
                e.cache_cost = min(new, p.own_tokens)
            e.compaction_cost = p.fixed + e.cache_cost
        self._pending = []

    # -- acm: manage_context / query_memory -------------------------------------------------------

    def _helper_ids(self, system: str, text: str) -> list[int]:
        """The token ids of a helper call (summariser, querier, reflection): its own chat."""
        return self.helper_renderer.encode(
            self.helper_renderer.tokenizer.apply_chat_template(
                prompts.helper_messages(system, text), tokenize=False, add_generation_prompt=True
            )
        )

    def _boundary(self) -> int:
        last = max((i for i, item in enumerate(self.state) if prompts.is_summary(item)), default=0)
        return last + 1

    def _summarise(
        self,
        items: State,
        kept: State,
        on_done: Callable[[str, ModelCall, dict[str, int]], None],
    ) -> Request:
        """Ask the summariser for a summary of ``items``; ``on_done`` gets it, its call and
        the needed facts it kept (``facts_in`` / ``facts_kept`` of the event: the task's key
        terms in ``items`` and not in ``kept``, the context that stays)."""
        steps = prompts.items_text(items)
        text = prompts.summariser_prompt(self.agent).format(task=self.task.prompt, steps=steps)
        ids = self._helper_ids(prompts.SUMMARISER_SYSTEM, text)
        if self._key_terms is None:
            try:
                self._key_terms = self.env.key_terms(self.task)
            except Exception as exc:  # a measurement never ends an episode
                warnings.warn(
                    f"{self.env.name}.key_terms failed on {self.task.id} ({exc!r}): its "
                    "summaries are not scored for the facts they keep",
                    stacklevel=2,
                )
                self._key_terms = []
        terms = self._key_terms

        def done(c: Completion) -> None:
            summary = c.text.strip()
            n_in, n_kept = terms_kept(terms, steps, summary, prompts.items_text(kept))
            facts = {"facts_in": n_in, "facts_kept": n_kept}
            on_done(summary, self._record("summariser", ids, c), facts)

        return self._ask("summariser", ids, self.agent.summary_max_tokens, done)

    def _manage_context(self, call_id: str, call_tokens: int) -> Request | None:
        start, call_item = self._boundary(), self.state[-1]
        items = self.state[start:-1]
        if not items:
            self._output(call_id, "Nothing to compact: no steps since the last summary.")
            return None

        def done(summary: str, helper: ModelCall, facts: dict[str, int]) -> None:
            assert self.archive is not None and self._step is not None
            sid = self.archive.put(items, summary)
            self.state = [*self.state[:start], prompts.summary_item(summary, sid), call_item]
            event = self._event("manage_context", call_tokens, helper, summary_id=sid, **facts)
            self._step.helper_calls.append(helper)
            self._step.events.append(event)
            self._output(call_id, f"Compacted {len(items)} items into summary {sid}.")

        return self._summarise(items, self.state[:start], done)

    def _query_memory(self, call_id: str, args: dict[str, Any], call_tokens: int) -> Request | None:
        assert self.archive is not None
        sid = args["summary_id"].strip()
        try:
            items = self.archive.get(sid)
        except ArchiveError as exc:
            self._output(call_id, f"Error: {exc}")
            return None
        text = prompts.querier_prompt(self.agent).format(
            summary_id=sid, steps=prompts.items_text(items), query=args["query"]
        )
        ids = self._helper_ids(prompts.QUERIER_SYSTEM, text)

        def done(c: Completion) -> None:
            assert self._step is not None
            helper = self._record("querier", ids, c)
            self._step.helper_calls.append(helper)
            without = len(self.renderer.ids(self.state, add_generation_prompt=False))
            self._output(call_id, f"[from {sid}] {c.text.strip() or '(nothing found)'}")
            own = len(self.renderer.ids(self.state, add_generation_prompt=False)) - without
            self._step.events.append(
                self._event("query_memory", call_tokens, helper, own, summary_id=sid)
            )

        return self._ask("querier", ids, self.agent.query_max_tokens, done)

    # -- memory arm: background reflection --------------------------------------------------------

    def _reflect(self, call_id: str) -> Request:
        """Distil the new call and its result into the memory (a helper call of its own, counted
        as the summariser's); results the agent has already acted on leave the context."""
        items = self.state[-2:]
        text = prompts.REFLECT_PROMPT.format(
            task=self.task.prompt,
            memory=self.memory or "(empty)",
            steps=prompts.items_text(items),
        )
        ids = self._helper_ids(prompts.SUMMARISER_SYSTEM, text)

        def done(c: Completion) -> None:
            assert self._step is not None
            helper = self._record("summariser", ids, c)
            self.memory = c.text.strip() or self.memory
            moved = set(self._raw)
            for item in self.state:
                if item["type"] == "function_call_output" and item["call_id"] in moved:
                    item["output"] = prompts.MOVED
            self._raw = [call_id]
            self._step.helper_calls.append(helper)
            self._step.events.append(
                self._event("memory", 0, helper, detail=f"moved {len(moved)} results")
            )

        return self._ask("summariser", ids, self.agent.summary_max_tokens, done)

    # -- summary arm: the monitor -----------------------------------------------------------------

    def _on_summarise(self) -> Request | None:
        items = self.state[1:]

        def done(summary: str, helper: ModelCall, facts: dict[str, int]) -> None:
            self.state = [self.state[0], prompts.summary_item(summary or "(empty)", None)]
            step = Step(self.turn, None, origin="harness")
            step.helper_calls.append(helper)
            step.events.append(self._event("summary", 0, helper, **facts))
            self.traj.steps.append(step)
            self.phase = "generate"

        self.phase = "generate"  # resumes there once the summary is in
        return self._summarise(items, self.state[:1], done)

    # -- evolve -----------------------------------------------------------------------------------

    def _evolve(self, call: ToolCall) -> None:
        assert self._step is not None
        limits = EvolveLimits(
            time_ms=self.agent.evolve_time_ms, heap_bytes=self.agent.evolve_heap_mb * MiB
        )
        result = apply_evolve(
            self.state,
            limits,
            renderer=self.renderer,
            call_tokens=call.tokens,
            output_weight=self.agent.output_weight,
            before_ids=self.last_input,
        )
        self.state = result.state
        self._step.observations.append(output_text(self.state[-1]))
        # applied or refused, the edit is charged its generated tokens and the Cache Cost of
        # the next input (the receipt's figures tell the model what the edit itself did)
        self._step.events.append(
            self._event(
                "evolve", call.tokens, None, applied=result.applied, detail=result.error or ""
            )
        )


def arm_tools(env_tools: list[dict[str, Any]], arm: str) -> list[dict[str, Any]]:
    """The tools of an arm: the environment's, plus the arm's context tools."""
    extra = {
        "acm": prompts.ACM_TOOLS,
        "evolve": [EVOLVE_TOOL_SCHEMA],
        "memory": prompts.MEMORY_TOOLS,
    }.get(arm, [])
    return [*env_tools, *extra]


def repeated_call(name: str, turn: int) -> str:
    """The observation of ``agent.repeat_rule`` for a call made before (in every arm alike)."""
    return (
        f"You already called {name} with these arguments on turn {turn + 1}; it was not run "
        "again. Use its result, or make a different call."
    )


@dataclass
class _Pending:
    """A context event waiting for the next model input: its cost so far (generated tokens at
    the output weight, the helper's unreused prompt) and, for ``query_memory``, the tokens its
    own output adds to the input."""

    event: ContextEvent
    fixed: float
    own_tokens: int
