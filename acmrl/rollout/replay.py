"""Replay: run an episode again up to a turn of a recorded trajectory, then let a real engine go on.

The teacher's splice (:mod:`acmrl.teacher.splice`) and GRPO's decision groups
(:mod:`acmrl.train.decisions`) both rebuild the State an episode had at one of its turns by
playing its recorded completions back through the real environment and context tools, then
sample from there. A completion is played back as it was recorded (its token ids and why it
ended), so the episode takes the same path: a turn cut at the token limit stays cut.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from acmrl.context.prefix import reusable_prefix
from acmrl.engines.base import Completion, Engine, Request
from acmrl.engines.scripted import ScriptedEngine
from acmrl.rollout.records import ModelCall, Trajectory


@dataclass(frozen=True)
class Recorded:
    """A completion as a trajectory recorded it, replayed as it was: its token ids and why it
    ended (a turn cut at the token limit stays cut; a text replayed would end as a plain reply,
    which the agent takes for the final answer), its logprobs and the prompt tokens the engine
    reused (so a replayed call costs what the recorded one did)."""

    text: str
    ids: list[int]
    finish: str
    logprobs: list[float] | None = None
    cached: int = 0

    @classmethod
    def of(cls, call: ModelCall, text: str) -> Recorded:
        return cls(
            text, call.completion_ids, call.finish_reason, call.logprobs, call.cached_prefix_tokens
        )

    def completion(self, req: Request) -> Completion:
        n = len(self.ids)
        lp = self.logprobs if self.logprobs and len(self.logprobs) == n else [0.0] * n
        return Completion(
            req.session_id,
            list(self.ids),
            list(lp),
            min(self.cached, max(0, len(req.prompt_ids) - 1)),
            self.finish,
            self.text,
            len(req.prompt_ids),
        )


class SpliceEngine(Engine):
    """Scripted replies while a session has some left (texts, or :class:`Recorded` completions
    played back as they were), then the real engine.

    A session's first live call reports at least the reuse a per-session cache would have had
    from its last replayed call (``prompt + completion``, as the ``hf`` engine stores it): the
    real engine never saw the replayed calls, and a continuation must not look dearer than the
    recorded episode it continues."""

    name = "splice"

    def __init__(
        self, real: Engine, tokenizer: Any, scripts: dict[str, list[str | Recorded]]
    ) -> None:
        self.real = real
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.tokenizer = tokenizer
        self._used: dict[str, int] = {}
        self._read: dict[str, list[int]] = {}  # a session's last replayed prompt + completion

    def _scripted_left(self, session_id: str) -> bool:
        return self._used.get(session_id, 0) < len(self.scripts.get(session_id, []))

    def generate(self, requests: list[Request]) -> list[Completion]:
        done: dict[int, Completion] = {}
        texts: dict[str, str] = {}  # a session asks once per batch
        for r in [r for r in requests if self._scripted_left(r.session_id)]:
            i = self._used.get(r.session_id, 0)
            self._used[r.session_id] = i + 1
            item = self.scripts[r.session_id][i]
            if isinstance(item, Recorded):
                done[id(r)] = item.completion(r)
            else:
                texts[r.session_id] = item
        scripted = [r for r in requests if r.session_id in texts and id(r) not in done]
        if scripted:
            engine = ScriptedEngine(self.tokenizer, lambda sid, _: texts[sid], truncate=False)
            done |= dict(zip(map(id, scripted), engine.generate(scripted), strict=True))
        for r in requests:
            if id(r) in done:
                self._read[r.session_id] = r.prompt_ids + done[id(r)].completion_ids[:-1]
        live = [r for r in requests if id(r) not in done]
        for r, c in zip(live, self.real.generate(live) if live else [], strict=True):
            if (before := self._read.pop(r.session_id, None)) is not None:
                own = min(reusable_prefix(before, r.prompt_ids), len(r.prompt_ids) - 1)
                c = dataclasses.replace(c, cached_prefix_tokens=max(c.cached_prefix_tokens, own))
            done[id(r)] = c
        return [done[id(r)] for r in requests]

    def release(self, session_id: str) -> None:
        self.real.release(session_id)


def replayed_turns(
    source: Trajectory, step: int, tokenizer: Any
) -> tuple[list[Recorded], dict[str, list[Recorded]]]:
    """What a replay of ``source`` up to its policy step ``step`` plays, as recorded: the
    student's turns before that step, and (per helper role) the summariser or querier replies
    they and the harness triggered."""
    policy: list[Recorded] = []
    helpers: dict[str, list[Recorded]] = {}
    n = 0
    for s in source.steps:
        if s.call is not None and s.call.role == "policy":
            if n == step:
                break
            n += 1
            policy.append(Recorded.of(s.call, s.text))
        for h in s.helper_calls:
            # a helper has no stop strings: a stop is its end-of-turn token, not in its text
            ids = h.completion_ids[:-1] if h.finish_reason == "stop" else h.completion_ids
            text = tokenizer.decode(ids, skip_special_tokens=False)
            helpers.setdefault(h.role, []).append(Recorded.of(h, text))
    return policy, helpers
