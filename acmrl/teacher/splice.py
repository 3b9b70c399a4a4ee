"""Splice and resume: cut a trajectory at the teacher's edit and let the student go on from there.

The episode is rebuilt by replaying the student's own turns before the edit (and the summariser or
querier replies they triggered) through the real environment and context tools, so the State at
the edit is exactly the one the student had. The teacher's turn (its first-person rationale and
the tool call) replaces the student's turn at the edit; the call really executes (a compaction
really compacts), and from the next turn on the real student engine generates. Each resumed
trajectory keeps token origin: replayed steps are the original policy calls (ids and logprobs
copied from the source trajectory), the edited step is ``teacher``, later steps ``policy``.
"""

from __future__ import annotations

import copy
from typing import Any

from acmrl.config import AgentConfig, SamplingConfig
from acmrl.context.render import format_tool_call
from acmrl.engines.base import Engine
from acmrl.engines.scripted import ScriptedEngine
from acmrl.envs.base import Environment, Task
from acmrl.rollout.agent import Episode
from acmrl.rollout.records import Trajectory
from acmrl.rollout.replay import Recorded, SpliceEngine, replayed_turns
from acmrl.rollout.worker import run_episodes
from acmrl.teacher.assessment import Assessment


def teacher_turn(a: Assessment) -> str:
    assert a.action is not None
    return f"{a.rationale}\n{format_tool_call(a.action['name'], a.action['arguments'])}"


def _scripts(
    source: Trajectory, edit: Assessment, episode_id: str, tokenizer: Any
) -> dict[str, list[str | Recorded]]:
    """What to replay: the student's turns before the edit, then the teacher's turn; and the
    helper replies those turns triggered."""
    policy, helpers = replayed_turns(source, edit.step, tokenizer)
    return {
        episode_id: [*policy, teacher_turn(edit)],
        **{f"{episode_id}/{role}": texts for role, texts in helpers.items()},
    }


def state_before(
    env: Environment,
    task: Task,
    source: Trajectory,
    step: int,
    tokenizer: Any,
    *,
    agent: AgentConfig,
    sampling: SamplingConfig,
) -> list[dict[str, Any]]:
    """The State the student had at policy step ``step`` of ``source``: its turns before that
    step (and the helper replies they triggered) replayed through the real environment and
    context tools, as a resume does, stopped when the step's turn is asked for."""
    probe = Assessment("correction", step, {"name": "answer", "arguments": {"text": ""}})
    eid = f"{source.episode_id}#state{step}"
    scripts = _scripts(source, probe, eid, tokenizer)
    scripts[eid] = scripts[eid][:-1]  # the student's turns only
    ep = Episode(eid, env, task, source.arm, tokenizer, agent=agent, sampling=sampling)
    captured: list[list[dict[str, Any]]] = []

    def stop(session_id: str, prompt: str) -> str:
        if not captured:
            captured.append(copy.deepcopy(ep.state))
        return format_tool_call("answer", {"text": ""})

    engine = SpliceEngine(ScriptedEngine(tokenizer, stop), tokenizer, scripts)
    run_episodes([ep], engine, concurrency=1)
    if not captured:
        raise ValueError(f"{source.episode_id} ended before policy step {step}")
    return captured[0]


def splice_episodes(
    env: Environment,
    task: Task,
    source: Trajectory,
    edit: Assessment,
    tokenizer: Any,
    *,
    agent: AgentConfig,
    sampling: SamplingConfig,
    n: int = 1,
    seed: int = 0,
) -> tuple[list[Episode], dict[str, list[str | Recorded]]]:
    """``n`` episodes that will replay ``source`` up to the edit and resume after it, and the
    scripts that drive the replay (keyed by engine session)."""
    if edit.kind == "no_action" or edit.action is None:
        raise ValueError("only an injection or a correction can be spliced in")
    episodes, scripts = [], {}
    for r in range(n):
        eid = f"{source.episode_id}#edit{r}"
        scripts |= _scripts(source, edit, eid, tokenizer)
        episodes.append(
            Episode(
                eid,
                env,
                task,
                edit.arm or source.arm,  # an injected manage_context switches react to acm
                tokenizer,
                agent=agent,
                sampling=sampling,
                sample=r,
                seed=seed + r,
                model=source.model,
            )
        )
    return episodes, scripts


def run_spliced(
    jobs: list[tuple[Trajectory, Assessment, list[Episode], dict[str, list[str | Recorded]]]],
    engine: Engine,
    tokenizer: Any,
    *,
    helper_engine: Engine | None = None,
    concurrency: int = 8,
) -> list[list[Trajectory]]:
    """Run the spliced episodes of many edits together (their model calls batched); the resumed
    trajectories per job, marked with their origin and the edit's provenance."""
    scripts = {k: v for *_, sc in jobs for k, v in sc.items()}
    helper_keys = {k for k in scripts if k.rsplit("#edit", 1)[-1].count("/")}
    policy = SpliceEngine(
        engine, tokenizer, {k: v for k, v in scripts.items() if k not in helper_keys}
    )
    helpers = SpliceEngine(helper_engine or engine, tokenizer, {k: scripts[k] for k in helper_keys})
    run_episodes(
        [e for _, _, eps, _ in jobs for e in eps],
        policy,
        helper_engine=helpers,
        concurrency=concurrency,
    )
    out = []
    for source, edit, eps, _ in jobs:
        for ep in eps:
            _mark(ep.traj, source, edit)
        out.append([ep.traj for ep in eps])
    return out


def resume(
    env: Environment,
    task: Task,
    source: Trajectory,
    edit: Assessment,
    engine: Engine,
    tokenizer: Any,
    *,
    agent: AgentConfig,
    sampling: SamplingConfig,
    n: int = 1,
    seed: int = 0,
    helper_engine: Engine | None = None,
) -> list[Trajectory]:
    """``n`` student continuations from the teacher's edit of ``source``."""
    eps, scripts = splice_episodes(
        env, task, source, edit, tokenizer, agent=agent, sampling=sampling, n=n, seed=seed
    )
    (out,) = run_spliced(
        [(source, edit, eps, scripts)],
        engine,
        tokenizer,
        helper_engine=helper_engine,
        concurrency=n,
    )
    return out


def _mark(traj: Trajectory, source: Trajectory, edit: Assessment) -> None:
    """Restore the student's own ids and logprobs on replayed steps; mark the teacher's step.

    After an arm switch the replayed turns were read in the new arm's context (its system prompt
    and tools): they keep those prompts, their texts must match the student's, and they carry no
    behaviour logprobs (the student never saw that context)."""
    src = [s for s in source.steps if s.call is not None and s.call.role == "policy"]
    switched = traj.arm != source.arm
    n = 0
    for step in traj.steps:
        if step.call is None or step.call.role != "policy":
            continue
        if n < edit.step:
            original = src[n].call
            if switched:
                if step.text.strip() != src[n].text.strip():
                    raise RuntimeError(f"replay of {source.episode_id} diverged at step {n}")
                step.call.logprobs = []
            elif original.prompt_ids != step.call.prompt_ids:
                raise RuntimeError(f"replay of {source.episode_id} diverged at step {n}")
            else:
                step.call = original
        elif n == edit.step:
            step.origin = "teacher"
            step.call.role = "teacher"
            step.call.logprobs = []  # not the student's: no behaviour logprobs
        n += 1
    traj.edit = {
        "source": source.episode_id,
        "step": edit.step,
        "kind": edit.kind,
        "action": edit.action,
        "rationale": edit.rationale,
        "teacher": edit.teacher,
        **({"switched_from": source.arm} if switched else {}),
    }
