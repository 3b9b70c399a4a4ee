"""Decision groups: GRPO groups that branch at the state where the policy chose whether to
compact, so the advantage credits that choice rather than a whole episode.

A whole-episode group is G episodes of one task; the advantage of each is spread over all its
turns, and the one turn that decides whether to compact gets the credit of every other. A
decision group starts the same way, from one episode (the *source*), then:

1. **States.** The source's decision states are its policy turns that compact (a
   ``manage_context`` or ``evolve`` call) or whose input is above ``decisions.context_share`` of
   the budget (where compacting was an option). One is drawn, seeded by the run's seed and the
   episode id.
2. **Branches.** G branches replay the source up to that turn (its turns and the summariser
   or querier replies they triggered are played back through the real environment and context
   tools, as a teacher's splice does: :func:`acmrl.rollout.replay.replayed_turns`), then the
   policy samples the decision turn anew and goes on to the end: G samples of what follows one
   state, under the current policy, whose rewards form the group. The source is a *scout*
   (``decisions.source=scout``, the default): it found the state and is not trained, since the
   state was drawn from what it did (at a state drawn because it compacted there, its own
   action is compaction by construction), so its reward is not a fair sample of that state.
   ``decisions.source=member`` keeps the source in its group beside G - 1 branches, one branch
   cheaper, with that bias.
3. **Credit.** Each member's advantage goes to its decision turn's tokens (and the summaries or
   extracts that turn triggered), or with ``decisions.credit=continuation`` to every turn from
   the decision on. Turns before it are the same in every member: context, never targets.

A source without a decision state gets G more whole episodes instead (a whole-episode group;
G - 1 beside the source as a member), run after the branches (so the branches' prefill is measured alone). The engine's prefix cache makes branches cheap: every
branch of a group starts from the same input, which the ``hf`` engine reads once and lends to
the others (``share_prefix``); :func:`prefill_figures` counts what was read with and without it.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import Any

from acmrl.engines.base import Engine
from acmrl.rollout.agent import Episode, make_episode
from acmrl.rollout.records import Trajectory
from acmrl.rollout.replay import Recorded, SpliceEngine, replayed_turns
from acmrl.rollout.worker import run_episodes


@dataclass(frozen=True)
class Decision:
    """A decision state of an episode: before its policy turn ``turn`` (0-based)."""

    turn: int
    reason: str  # "tool": the policy compacted there; "context": its input was above the share
    share: float  # the turn's input tokens / the budget


def policy_turns(traj: Trajectory) -> list[Any]:
    """The steps of ``traj`` with a policy call, in order (turn ``n`` is the n-th)."""
    return [s for s in traj.steps if s.call is not None and s.call.role == "policy"]


#: the tools with which a policy compacts its own context
COMPACTION_TOOLS = ("manage_context", "evolve")


def decision_states(traj: Trajectory, budget: int, context_share: float) -> list[Decision]:
    """The turns of ``traj`` at which the policy chose whether to compact (module docstring)."""
    out = []
    for n, step in enumerate(policy_turns(traj)):
        share = len(step.call.prompt_ids) / max(1, budget)
        if any(a.get("name") in COMPACTION_TOOLS for a in step.actions):
            out.append(Decision(n, "tool", share))
        elif share >= context_share:
            out.append(Decision(n, "context", share))
    return out


def pick_decision(states: list[Decision], seed: int, episode_id: str) -> Decision | None:
    """One of ``states``, drawn with a seed of the run's seed and the episode id (so a resumed
    or repeated run draws the same); None when there is none."""
    if not states:
        return None
    salt = zlib.crc32(b"decision")  # not the episode's own sampling seed
    return random.Random(seed * 1_000_003 + zlib.crc32(episode_id.encode()) + salt).choice(states)


def branch_id(source_id: str, r: int) -> str:
    """Branch ``r`` of source ``...#arm#0`` is ``...#arm#b<r>``: the same group key."""
    return f"{source_id.rsplit('#', 1)[0]}#b{r}"


def branch_scripts(
    source: Trajectory, decision: Decision, eid: str, tokenizer: Any
) -> dict[str, list[Recorded]]:
    """What branch ``eid`` replays before its decision turn, keyed by engine session."""
    policy, helpers = replayed_turns(source, decision.turn, tokenizer)
    return {eid: policy, **{f"{eid}/{role}": texts for role, texts in helpers.items()}}


def mark_branch(traj: Trajectory, source: Trajectory, decision: Decision) -> bool:
    """Give the replayed turns of branch ``traj`` the source's own calls (its sampled ids and
    logprobs) and record the branch's origin; False when the replay diverged from the source
    (its inputs differ: the branch is then not a sample of the source's state)."""
    src = policy_turns(source)
    mine = policy_turns(traj)
    if len(mine) <= decision.turn:  # it ended before the decision turn
        return False
    for n in range(decision.turn + 1):  # the decision turn's input too: the same state
        if mine[n].call.prompt_ids != src[n].call.prompt_ids:
            return False
        if n < decision.turn:
            mine[n].call = src[n].call
    traj.edit = {
        "kind": "branch",
        "source": source.episode_id,
        "step": decision.turn,
        "reason": decision.reason,
        "share": decision.share,
    }
    return True


def run_with_replays(
    episodes: list[Episode],
    scripts: dict[str, list[Recorded]],
    engine: Engine,
    tokenizer: Any,
    *,
    concurrency: int,
) -> None:
    """Run ``episodes`` together: sessions with a script play it back first (policy and helper
    sessions alike), then, as every other episode, sample from ``engine``."""
    ids = {e.id for e in episodes}
    policy = {k: v for k, v in scripts.items() if k in ids}
    helpers = {k: v for k, v in scripts.items() if k not in ids}
    run_episodes(
        episodes,
        SpliceEngine(engine, tokenizer, policy),
        helper_engine=SpliceEngine(engine, tokenizer, helpers),
        concurrency=concurrency,
    )


def turns_credited(decision: Decision, credit: str) -> tuple[int, int | None]:
    """The policy turns a decision group's member is trained on."""
    return (decision.turn, decision.turn if credit == "decision" else None)


def live_calls(traj: Trajectory, start: int) -> list[Any]:
    """The model calls of ``traj`` from its policy turn ``start`` on (that turn's helper calls
    included, the harness's before it not): what a branch really generated and read."""
    calls, n = [], 0
    for step in traj.steps:
        policy = step.call is not None and step.call.role == "policy"
        if policy and n >= start:
            calls.append(step.call)
        n += policy
        if n > start:
            calls += step.helper_calls
    return calls


def own_prefill(calls: list[Any]) -> int:
    """The prompt tokens ``calls`` computed when each session reuses only its own cache: the
    prompts less the prefix each reused (an engine that keeps its own count knows better)."""
    return sum(len(c.prompt_ids) - c.cached_prefix_tokens for c in calls)


def prefill_figures(
    branches: list[tuple[Trajectory, int]], prefilled: int | None, n_groups: int
) -> dict[str, float]:
    """Per decision group, the prompt tokens the branches' live calls read without any prefix
    cache (every prompt in full) and the tokens the engine computed: its own count where it
    keeps one (the ``hf`` engine's, own and borrowed prefixes both saved), else the prompts less
    what each session reused of its own. ``branches``: every branch run (diverged ones too, as
    the engine worked for them) with its decision turn."""
    calls = [c for traj, start in branches for c in live_calls(traj, start)]
    prompt = sum(len(c.prompt_ids) for c in calls)
    if prefilled is None:
        prefilled = own_prefill(calls)
    g = max(1, n_groups)
    return {
        "decision/prompt_tokens_per_group": prompt / g,
        "decision/prefilled_tokens_per_group": prefilled / g,
        "decision/prefill_share": prefilled / max(1, prompt),
    }


@dataclass
class Branching:
    """What :func:`branch_phase` ran and kept: the episodes to train (branches that replayed
    exactly, and the extra whole episodes), the policy turns each decision group's member is
    credited on (sources too when they are members), the kept branches' ids, the scouts (the
    sources left out of training), every branch's decision turn (where its calls are live),
    the model calls of the branches dropped as diverged (never trained, but the engine ran
    them) and the phase's ``decision/*`` figures."""

    episodes: list[Episode] = field(default_factory=list)
    credit: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)
    scouts: set[str] = field(default_factory=set)
    live_from: dict[str, int] = field(default_factory=dict)
    dropped_calls: list[Any] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


def branch_phase(sources: list[Episode], cfg: Any, env: Any, tok: Any, engine: Engine) -> Branching:
    """GRPO's second rollout phase (``cfg``: a ``GRPOConfig``): branches from a decision state
    of each source, whole episodes for each source without one (G of them, or G - 1 with
    ``decisions.source=member``)."""
    dc, out = cfg.decisions, Branching()
    scout = dc.source == "scout"
    jobs, scripts, whole, picked = {}, {}, [], []
    for src in sources:
        d = pick_decision(decision_states(src.traj, src.budget, dc.context_share), cfg.seed, src.id)
        if scout:  # marked in the rollouts log, as branches are, so analyses can leave it out
            out.scouts.add(src.id)
            src.traj.edit = {"kind": "scout", "step": d.turn if d else None}
        for r in range(1, cfg.group_size + scout):
            # without a decision state the group is a whole-episode one
            eid = branch_id(src.id, r) if d else src.id.rsplit("#", 1)[0] + f"#{r}"
            ep = make_episode(
                cfg, eid, env, src.task, src.arm, r, tok, sample_helpers=cfg.train_helpers
            )
            if d is None:
                whole.append(ep)
            else:
                jobs[eid] = (ep, src, d)
                scripts |= branch_scripts(src.traj, d, eid, tok)
        if d is not None:
            if not scout:
                out.credit[src.id] = turns_credited(d, dc.credit)
            picked.append(d)
    before = getattr(engine, "prefilled_tokens", None)
    branches = [ep for ep, _, _ in jobs.values()]
    if branches:
        run_with_replays(branches, scripts, engine, tok, concurrency=cfg.concurrency)
    after = getattr(engine, "prefilled_tokens", None)
    if whole:  # after the branches, so that the engine's count above is theirs alone
        run_episodes(whole, engine, concurrency=cfg.concurrency)
    diverged = 0
    for ep, src, d in jobs.values():
        out.live_from[ep.id] = d.turn
        if mark_branch(ep.traj, src.traj, d):
            out.credit[ep.id] = turns_credited(d, dc.credit)
            out.ids.add(ep.id)
            out.episodes.append(ep)
        else:
            diverged += 1
            out.dropped_calls += live_calls(ep.traj, d.turn)
    out.episodes += whole
    n = len(picked)
    out.metrics = {
        "decision/groups": float(n),
        "decision/without_state": float(len(sources) - n),
        "decision/diverged": float(diverged),
        # of this process's drawn states: those at a compaction call, and where they lie
        "decision/at_compaction": sum(d.reason == "tool" for d in picked) / max(1, n),
        "decision/point": sum(d.share for d in picked) / max(1, n),
        **prefill_figures(
            [(ep.traj, d.turn) for ep, _, d in jobs.values()],
            None if before is None or after is None else after - before,
            n,
        ),
    }
    return out


__all__ = [
    "Branching",
    "Decision",
    "branch_id",
    "branch_phase",
    "branch_scripts",
    "decision_states",
    "live_calls",
    "mark_branch",
    "own_prefill",
    "pick_decision",
    "prefill_figures",
    "run_with_replays",
    "turns_credited",
]
