"""Per-turn training samples from a trajectory (the flat sample of DESIGN.md "Core data").

Both the teacher's dataset and the trainer build their samples here; it depends on the rollout
records only.

Model calls of the policy (and the teacher's spliced turn) are walked in order. A call whose
prompt extends the previous sample's tokens exactly is packed into it (the new environment tokens
in between are context, not targets); a prefix break (any compaction or edit of the history)
starts a new sample, so every sample is exactly the token sequence the model read and wrote.

Per token: ``origin`` (0 environment/harness, 1 policy, 2 teacher), ``loss_mask`` (1 on policy and
teacher tokens) and ``old_logprobs`` (the student's logprobs on its own tokens, 0 elsewhere).
Per sample: ``weight``, the soft supervision of the assessment: 1.0 for a sample that holds the
teacher's turn, otherwise the trajectory's score (a failed student run teaches nothing).

With ``helpers=True`` the summariser and querier calls (the student writing its own summaries and
extracts) become samples too, one per call, after the policy samples: GRPO trains *how* to
compact as well as *when*.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from acmrl.rollout.records import Trajectory

ENV, POLICY, TEACHER = 0, 1, 2


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

    def extend(self, ids: list[int], origin: int, logprobs: list[float] | None = None) -> None:
        self.token_ids += ids
        self.origin += [origin] * len(ids)
        self.loss_mask += [int(origin != ENV)] * len(ids)
        lp = logprobs if logprobs and len(logprobs) == len(ids) else [0.0] * len(ids)
        self.old_logprobs += lp if origin == POLICY else [0.0] * len(ids)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trajectory_samples(traj: Trajectory, helpers: bool = False, pack: bool = True) -> list[Sample]:
    """The samples of ``traj``; ``pack=False`` gives one sample per call (for comparisons)."""
    samples: list[Sample] = []
    cur: Sample | None = None
    helper_calls = []
    for step in traj.steps:
        helper_calls += [c for c in step.helper_calls if c.role in ("summariser", "querier")]
        call = step.call
        if call is None or call.role not in ("policy", "teacher"):
            continue
        origin = TEACHER if call.role == "teacher" else POLICY
        n = len(cur.token_ids) if cur else 0
        if pack and cur is not None and call.prompt_ids[:n] == cur.token_ids:
            cur.extend(call.prompt_ids[n:], ENV)
        else:
            cur = Sample(traj.episode_id, len(samples))
            samples.append(cur)
            cur.extend(call.prompt_ids, ENV)
        cur.extend(call.completion_ids, origin, call.logprobs)
        cur.calls += 1
    for call in helper_calls if helpers else []:
        sample = Sample(traj.episode_id, len(samples))
        sample.extend(call.prompt_ids, ENV)
        sample.extend(call.completion_ids, POLICY, call.logprobs)
        sample.calls = 1
        samples.append(sample)
    for s in samples:
        s.weight = 1.0 if TEACHER in s.origin else float(traj.score)
    return samples
