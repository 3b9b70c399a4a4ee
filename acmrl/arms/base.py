"""What an arm is: the agent's means of handling its context, in the harness and for the teacher.

An :class:`Arm` is stateless (one instance serves every episode); what an episode of it keeps
(an archive, a memory) lives on the episode, set up by :meth:`Arm.start`. Its hooks are called
at fixed points of the agent loop (:class:`acmrl.rollout.agent.Episode`) and of the teacher's
scripted policies (:mod:`acmrl.teacher.demonstrate`, :mod:`acmrl.teacher.ceiling`,
:mod:`acmrl.teacher.oracle`); the default of each hook is what an arm without context tools
does: nothing. The hooks receive the episode or the teacher's policy object itself, and use
only their public attributes and methods, listed where each hook is defined.

A teacher hook returns a turn as ``(rationale, tool name, arguments)``; the teacher writes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from acmrl.rollout.prompts import BASE_PROMPT

Turn = tuple[str, str, dict[str, Any]]  # a scripted turn: rationale, tool, arguments


class Arm:
    """The ``react`` behaviour: the environment's tools and nothing else. Subclasses override
    what their arm adds."""

    name = "react"
    #: the arm's own tool schemas, after the environment's
    tools: ClassVar[Sequence[dict[str, Any]]] = ()
    #: the policy compacts by a call of its own (its turns can be a compaction decision): the
    #: harness's hint, the teacher's demonstrated compactions and injected edits apply to it
    compacts = False
    #: what a teacher's compaction turn says before its call (demonstrations, injections)
    demo_compaction_says = ""
    injection_says = ""
    #: the turn after the policy's compaction continues the plan its summary wrote down
    resumes_from_summary = False
    #: the policy's tool that brings back what left the context (its archive or its memory);
    #: None: the arm has none. Reports count its calls on the tasks that need an archived detail
    archive_tool: ClassVar[str | None] = None
    #: the arm keeps no fact by means of its own, only in the policy's thoughts: the audit also
    #: plays its ceiling ``noted`` (each thought repeating the evidence read so far)
    noted_ceiling = False
    #: the arm's best policy, the one its teacher demonstrates (``teacher.policy=best``), is the
    #: noted one: its results leave the context and only its thoughts can carry them
    best_noted = False

    @property
    def tool_names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    def system_prompt(self, budget: int, agent: Any = None) -> str:
        """The system prompt of an episode under a context budget of ``budget`` tokens, with
        the agent settings ``agent`` (an :class:`~acmrl.config.AgentConfig`; None: defaults)."""
        return BASE_PROMPT

    def tool_schemas(self, agent: Any = None) -> Sequence[dict[str, Any]]:
        """The arm's own tool schemas under the agent settings ``agent`` (None: defaults)."""
        return self.tools

    # -- the harness (acmrl.rollout.agent.Episode) ------------------------------------------------
    # An episode offers: state, task, env, agent, budget, turn, traj, step (the current policy
    # step), archive, memory, raw_results; boundary(), summarise(items, kept, on_done), event(...),
    # output(call_id, text), ask(role, ids, max_tokens, resume), record(role, ids, completion),
    # helper_ids(system, text), renderer, last_input.

    def start(self, ep: Any) -> None:
        """Set up what an episode of this arm keeps besides its State."""

    def before_generate(self, ep: Any, ids: list[int]) -> Any:
        """Called before each policy generation with the input ``ids`` it would read: a model
        request of the arm's own (a harness-side compaction; the episode resumes generating once
        it is answered), or None to go on."""
        return None

    def run_call(self, ep: Any, call_id: str, call: Any) -> Any:
        """Run one of the arm's own tool calls (``call.name`` in :attr:`tool_names`); its call
        item is already in the State. A model request (a helper call), or None when done."""
        raise NotImplementedError(f"the {self.name} arm has no tool {call.name!r}")

    def after_env_call(self, ep: Any, call_id: str) -> Any:
        """Called after an environment call's result entered the State (not after the
        answer): a model request of the arm's own, or None."""
        return None

    # -- the teacher (acmrl.teacher) --------------------------------------------------------------
    # A teacher's policy object (Demonstrator, CeilingPolicy) offers: task, env, budget, done
    # (the environment calls made), compacted, read_memory, queried, keep_code, size(prompt),
    # in_view(args, prompt), compaction_turn(size, name, args).

    def compaction(
        self,
        task: Any,
        plan: list[Any],
        seen: str,
        *,
        repeats: bool,
        keep: Sequence[str] = (),
    ) -> tuple[str, dict[str, Any]]:
        """The compaction call the teacher makes or injects for this arm (``compacts`` arms),
        given what the agent has seen and the lines of its results that the environment says a
        teacher keeps verbatim (``keep``: :func:`acmrl.arms.evolve_edits.kept_lines`):
        ``(tool name, arguments)``."""
        raise NotImplementedError(f"the {self.name} arm does not compact by a call")

    def compaction_reserve(self, policy: Any, prompt: str) -> int:
        """Tokens a teacher that reads on must leave free for this arm's next compaction turn,
        given the input ``prompt`` it has now: 0 when the turn is short (``manage_context()``),
        what the turn leaves in the input when it is long (an ``evolve`` program, or only its
        stub and receipt once its text leaves the context)."""
        return 0

    def demo_detour(self, policy: Any, prompt: str, name: str, args: dict[str, Any]) -> Turn | None:
        """A turn the arm makes before the plan's next call ``name(args)``, in demonstrations
        and ceilings alike, or None."""
        return None

    def recover(self, policy: Any, prompt: str, evidence: Any) -> Turn | None:
        """The arm's own way (before reading its document again) to bring back the answer's
        ``evidence`` once the plan is read through and it is not in view, or None."""
        return None
