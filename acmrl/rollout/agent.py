"""The agent loop: one episode as an explicit state machine over the State of ``acmrl/context``.

Phases, one handler each:

- ``generate``: render the State (system prompt and tools included), let the arm act before
  the generation (the ``summary`` arm's monitor, ``acm``'s forced compaction), check the budget,
  and ask for a policy completion;
- ``tools``: run the parsed calls one by one: environment tools through the session, ``answer``,
  and the arm's own tools (:mod:`acmrl.arms`: ``manage_context`` and ``query_memory`` need a
  summariser or querier model call; ``evolve`` runs in the sandbox; after an environment call
  the ``memory`` arm's reflection runs);
- ``done``: the trajectory is complete.

What differs between arms lives in :mod:`acmrl.arms`; the episode calls its arm's hooks and
offers them the public helpers below (``ask``, ``record``, ``event``, ``summarise``,
``boundary``, ``output``, ``helper_ids``).

The loop never talks to an engine: ``next_request()`` advances until a model call is needed and
returns it, ``receive(completion)`` resumes. The worker batches the requests of many episodes.
Every model call is recorded with its token ids, logprobs and the prefix the engine reused; every
context event with the cost figures of docs/design.md.
"""

from __future__ import annotations

import json
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from acmrl.arms import arm_tools, get_arm
from acmrl.config import AgentConfig, ModelConfig, SamplingConfig
from acmrl.context.archive import Archive
from acmrl.context.prefix import compaction_cost, reusable_prefix
from acmrl.context.render import Renderer, ToolCall, parse_completion, text_call
from acmrl.context.state import (
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
        self.arm_def = get_arm(arm)  # what this arm does (acmrl.arms); names a wrong one
        self.id, self.env, self.task, self.arm = episode_id, env, task, arm
        self.agent, self.sampling, self.seed = agent, sampling, seed
        # helper calls that are trained (GRPO's train_helpers) must be sampled from the policy,
        # as its turns are; otherwise they are greedy
        self.sample_helpers = sample_helpers
        self.budget = prompts.context_budget(agent, env)
        self.session = env.session(task)
        self.tools = arm_tools(self.session.tools, arm, agent)
        system = self.arm_def.system_prompt(self.budget, agent)
        self.renderer = Renderer(tokenizer, system, self.tools)
        self.helper_renderer = Renderer(tokenizer, None, [])
        self.state: State = [user(task.prompt)]
        self.archive: Archive | None = None  # acm: what its compactions archived
        self.memory = ""  # the memory arm's external store (what the reflections kept)
        self.raw_results: list[str] = []  # memory arm: call ids whose raw results are in context
        self.phase = "generate"
        self.turn = 0
        self.queue: list[ToolCall] = []
        self.last_input: list[int] = []  # the last policy prompt + completion: what is cached
        self._pending: list[_Pending] = []  # context events waiting for the next input
        # environment call -> (turn, call id) of its latest run
        # each environment call (name, arguments): its turn, call id and the result returned
        self._env_calls: dict[tuple[str, str], tuple[int, str, str]] = {}
        self._key_terms: list[str] | None = None  # env.key_terms(task), at the first summary
        self._resume: Callable[[Completion], None] | None = None
        self.pending_role = "policy"
        self.step: Step | None = None  # the policy step whose calls run
        self.traj = Trajectory(
            episode_id, task.id, env.name, arm, sample, seed, model, task.prompt, task.answer
        )
        self.arm_def.start(self)

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
        # what went wrong outside the policy's control (an MCP server restarted mid-episode)
        t.metrics["env_incidents"] = len(getattr(self.session, "incidents", ()))
        if self.archive is not None:
            self.archive.close()

    def ask(self, role: str, ids: list[int], max_tokens: int, resume: Callable) -> Request:
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
    def record(role: str, req_ids: list[int], c: Completion) -> ModelCall:
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
        state = self.state
        own = self.arm_def.before_generate(self, ids)
        if own is not None:  # the episode generates once the arm's request is answered
            return own
        if self.state is not state:  # the arm edited the State in place of a request (mask)
            ids = self.renderer.ids(self.state)
        if len(ids) > self.budget and self.agent.on_overflow == "force_answer":
            return self._force_answer(len(ids))
        self._settle(ids)
        if len(ids) > self.budget:
            self.finish("overflow", f"the input has {len(ids)} tokens; the budget is {self.budget}")
            return None
        return self.ask(
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
        return self.ask(
            "policy", ids, self.sampling.max_new_tokens, lambda c: self._after_forced(ids, c)
        )

    def _after_forced(self, ids: list[int], c: Completion) -> None:
        """The reply to the forced-answer request: its answer call (or plain reply) is the
        answer; anything else ends the episode 'overflow'."""
        self.last_input = ids + c.completion_ids
        parsed = parse_completion(c.text, self.tools)
        step = Step(self.turn, self.record("policy", ids, c), c.text)
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

    def _after_policy(self, ids: list[int], c: Completion) -> None:
        call = self.record("policy", ids, c)
        self.last_input = ids + c.completion_ids
        parsed = parse_completion(c.text, self.tools)
        self.step = step = Step(self.turn, call, c.text)
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
        if self.agent.context_signal or (self.agent.harness_hint and self.arm_def.compacts):
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
            elif self.step is not None and self.step.errors:
                self._observe_user("\n".join(self.step.errors))
            else:
                self._end_turn()
            return None
        call = self.queue.pop(0)
        step = self.step
        assert step is not None
        call_id = f"call_{self.turn}_{len(step.actions)}"
        step.actions.append({"name": call.name, "arguments": call.arguments})
        self.state.append(function_call(call_id, call.name, call.arguments))
        if call.name in self.arm_def.tool_names:
            return self.arm_def.run_call(self, call_id, call)
        key = (call.name, json.dumps(call.arguments, sort_keys=True))
        if self.agent.repeat_rule and call.name != ANSWER_TOOL and self._in_view(key):
            self.output(call_id, repeated_call(call.name, self._env_calls[key][0]))
            return None
        obs = self.session.call(call.name, call.arguments)
        text = obs if isinstance(obs, str) else json.dumps(obs)
        self._env_calls[key] = (self.turn, call_id, text)
        self.output(call_id, text)
        if self.session.done:
            self.queue.clear()  # nothing runs after the answer
            return None
        return self.arm_def.after_env_call(self, call_id)

    def _in_view(self, key: tuple[str, str]) -> bool:
        """Whether the result of an earlier identical environment call is still in the context
        as it was returned (not compacted, summarised, edited away or moved to memory): what
        ``agent.repeat_rule`` refuses to run again. A result the agent can no longer see is
        read again, as a person would reopen a document."""
        if key not in self._env_calls:
            return False
        _, call_id, returned = self._env_calls[key]

        def as_returned(text: str) -> bool:  # the harness's notes ("[context: ...]") aside
            return text == returned or (
                text.startswith(returned) and text[len(returned) :].startswith("\n[")
            )

        return any(
            x["type"] == "function_call_output"
            and x["call_id"] == call_id
            and as_returned(output_text(x))
            for x in self.state
        )

    def output(self, call_id: str, text: str) -> None:
        self.state.append(function_call_output(call_id, text))
        assert self.step is not None
        self.step.observations.append(text)

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

    def event(
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
            helper_generated=gen,
            **kw,
        )
        fixed = compaction_cost(call_tokens + gen, read, self.agent.output_weight)
        self._pending.append(_Pending(event, fixed, own_tokens))
        return event

    def _settle(self, ids: list[int]) -> None:
        """Charge the pending events on ``ids``, the next model input actually sent
        (docs/design.md): Cache Cost = its tokens - the prefix it shares with the previous input +
        completion, receipts, other tool outputs, notes and the generation header included.
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

    # -- helpers of the arms: compaction and helper calls -----------------------------------------

    def helper_ids(self, system: str, text: str) -> list[int]:
        """The token ids of a helper call (summariser, querier, reflection): its own chat."""
        return self.helper_renderer.encode(
            self.helper_renderer.tokenizer.apply_chat_template(
                prompts.helper_messages(system, text), tokenize=False, add_generation_prompt=True
            )
        )

    def boundary(self) -> int:
        """The index of the first State item after the last summary (1: none yet)."""
        last = max((i for i, item in enumerate(self.state) if prompts.is_summary(item)), default=0)
        return last + 1

    def key_terms(self) -> list[str]:
        """The task's key terms (``env.key_terms``), read once: what a context edit is scored
        for keeping (``facts_in`` / ``facts_kept`` of its event)."""
        if self._key_terms is None:
            try:
                self._key_terms = self.env.key_terms(self.task)
            except Exception as exc:  # a measurement never ends an episode
                warnings.warn(
                    f"{self.env.name}.key_terms failed on {self.task.id} ({exc!r}): its "
                    "context edits are not scored for the facts they keep",
                    stacklevel=2,
                )
                self._key_terms = []
        return self._key_terms

    def summarise(
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
        ids = self.helper_ids(prompts.SUMMARISER_SYSTEM, text)
        terms = self.key_terms()

        def done(c: Completion) -> None:
            summary = c.text.strip()
            n_in, n_kept = terms_kept(terms, steps, summary, prompts.items_text(kept))
            facts = {"facts_in": n_in, "facts_kept": n_kept}
            on_done(summary, self.record("summariser", ids, c), facts)

        return self.ask("summariser", ids, self.agent.summary_max_tokens, done)


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


class EpisodeSettings(Protocol):
    """What :func:`make_episode` reads of a config (rollout, eval, GRPO)."""

    agent: AgentConfig
    sampling: SamplingConfig
    model: ModelConfig
    seed: int


def make_episode(
    cfg: EpisodeSettings,
    eid: str,
    env: Environment,
    task: Task,
    arm: str,
    sample: int,
    tokenizer: Any,
    *,
    sample_helpers: bool = False,
) -> Episode:
    """An episode of ``cfg``; its sampling seed derives from the config's seed and the episode
    id, so a rerun samples the same. ``sample_helpers``: the summariser and querier calls are
    sampled too (GRPO's ``train_helpers``, which trains them)."""
    return Episode(
        eid,
        env,
        task,
        arm,
        tokenizer,
        agent=cfg.agent,
        sampling=cfg.sampling,
        sample=sample,
        seed=cfg.seed * 1_000_003 + zlib.crc32(eid.encode()),
        model=cfg.model.name,
        sample_helpers=sample_helpers,
    )
