"""Per-turn training samples from a trajectory (the training sample of docs/design.md).

Both the teacher's dataset and the trainer build their samples here; it depends on the rollout
records only.

Model calls of the policy (and the teacher's spliced turn) are walked in order. A call whose
prompt extends the previous sample's tokens exactly is packed into it (the new environment tokens
in between are context, not targets); a prefix break (any compaction or edit of the history)
starts a new sample, so every sample is exactly the token sequence the model read and wrote.

Per token: ``origin`` (0 environment/harness, 1 policy, 2 teacher), ``loss_mask`` (1 on the
tokens a trainer may learn from), ``weights`` (the soft supervision of SFT) and ``old_logprobs``
(the student's logprobs on its own tokens, 0 elsewhere). The rule is per token, so packing never
changes what a token is taught (:class:`SampleWeights`):

- a resumed run (a teacher's ``injection`` or ``correction``): the student's replayed turns
  before the edit are context (loss mask 0); the teacher's turn has weight ``teacher``; the
  turns after it, and the summaries and extracts the student wrote after it, are weighted by the
  resumed run's outcome (``after_failure`` + (``after_success`` - ``after_failure``) x score: by
  default a failed resume teaches nothing);
- a student's own run without an edit: every turn is weighted by its outcome, as above;
- a demonstration (every policy turn the teacher's): every turn *and every summary or extract
  the teacher wrote in it* is a target, weighted ``demo_failure`` + (``demo_success`` -
  ``demo_failure``) x score (by default a failed demonstration teaches nothing);
- a GRPO branch (``edit["kind"] == "branch"``, :mod:`acmrl.train.decisions`): the source's
  turns replayed before the branch's decision turn are context, as before an edit.

``turns`` (first, last) limits the targets to those policy turns (and the summaries and extracts
they triggered); ``last`` None runs to the end. GRPO's decision groups credit a decision turn
alone, or it and the rest of its continuation, this way.

Per sample, ``weight`` is the largest token weight (0: nothing to learn in SFT).

With ``helpers=True`` the summariser and querier calls become samples too, one per call, after
the policy samples: the student writes its own summaries and extracts, so it must be taught to
(SFT) and GRPO trains *how* to compact as well as *when*. GRPO reads ``loss_mask`` only: its
signal is the advantage, not these weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from acmrl.rollout.records import ModelCall, Trajectory

ENV, POLICY, TEACHER = 0, 1, 2
EDITS = ("injection", "correction")
HELPERS = ("summariser", "querier")


@dataclass(frozen=True)
class SampleWeights:
    """SFT weights per token (module docstring); the defaults are ``annotate weights.*``.

    >>> w = SampleWeights()
    >>> w.outcome(1.0, demo=False), w.outcome(0.0, demo=False), w.outcome(0.0, demo=True)
    (1.0, 0.0, 0.0)
    """

    teacher: float = 1.0
    after_success: float = 1.0
    after_failure: float = 0.0
    demo_success: float = 1.0
    demo_failure: float = 0.0

    def outcome(self, score: float, demo: bool) -> float:
        hi, lo = (
            (self.demo_success, self.demo_failure)
            if demo
            else (self.after_success, self.after_failure)
        )
        return lo + (hi - lo) * float(score)


@dataclass
class Sample:
    episode_id: str
    index: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    origin: list[int] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)
    weight: float = 0.0
    calls: int = 0
    weights: list[float] = field(default_factory=list)
    kind: str = "policy"  # policy (its turns, the teacher's included) | summariser | querier

    def extend(
        self,
        ids: list[int],
        origin: int,
        logprobs: list[float] | None = None,
        weight: float = 0.0,
        trained: bool = True,
    ) -> None:
        """Append ``ids``; tokens not from the environment are targets when ``trained``."""
        target = int(origin != ENV and trained)
        self.token_ids += ids
        self.origin += [origin] * len(ids)
        self.loss_mask += [target] * len(ids)
        self.weights += [weight if target else 0.0] * len(ids)
        lp = logprobs if logprobs and len(logprobs) == len(ids) else [0.0] * len(ids)
        self.old_logprobs += lp if origin == POLICY else [0.0] * len(ids)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trajectory_samples(
    traj: Trajectory,
    helpers: bool = False,
    pack: bool = True,
    weights: SampleWeights | None = None,
    turns: tuple[int, int | None] | None = None,
) -> list[Sample]:
    """The samples of ``traj``; ``pack=False`` gives one sample per call (for comparisons);
    ``turns`` limits the targets to those policy turns (module docstring)."""
    w = weights or SampleWeights()
    edit = traj.edit or {}
    demo = edit.get("kind") == "demonstration"
    edit_step = int(edit["step"]) if edit.get("kind") in (*EDITS, "branch") else -1
    first, last = turns or (-1, None)

    def context(turn: int) -> bool:  # a turn whose tokens are context, not targets
        return turn < max(edit_step, first) or (last is not None and turn > last)

    outcome = w.outcome(traj.score, demo)
    samples: list[Sample] = []
    cur: Sample | None = None
    helper_calls: list[tuple[ModelCall, bool]] = []
    n = 0  # policy turns so far (the teacher's spliced turn counts: edit["step"] indexes these)
    for step in traj.steps:
        call = step.call
        turn = n if call is not None and call.role in ("policy", "teacher") else n - 1
        # a replayed turn before the edit (and what it triggered) is context; the summary the
        # student writes after the teacher's injected compaction is its own, after the edit
        replayed = context(turn)
        helper_calls += [(c, replayed) for c in step.helper_calls if c.role in HELPERS]
        if call is None or call.role not in ("policy", "teacher"):
            continue
        n += 1
        teacher = call.role == "teacher"
        origin = TEACHER if teacher else POLICY
        weight = w.teacher if teacher and not demo else outcome
        size = len(cur.token_ids) if cur else 0
        if pack and cur is not None and call.prompt_ids[:size] == cur.token_ids:
            cur.extend(call.prompt_ids[size:], ENV)
        else:
            cur = Sample(traj.episode_id, len(samples))
            samples.append(cur)
            cur.extend(call.prompt_ids, ENV)
        cur.extend(call.completion_ids, origin, call.logprobs, weight, trained=not replayed)
        cur.calls += 1
    for call, replayed in helper_calls if helpers else []:
        sample = Sample(traj.episode_id, len(samples), kind=call.role)
        sample.extend(call.prompt_ids, ENV)
        origin = TEACHER if demo else POLICY  # a demonstration's notes are the teacher's
        sample.extend(call.completion_ids, origin, call.logprobs, outcome, trained=not replayed)
        sample.calls = 1
        samples.append(sample)
    for s in samples:
        s.weight = max(s.weights, default=0.0)
    return samples
