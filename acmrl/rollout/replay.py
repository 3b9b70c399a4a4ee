"""Replay: run an episode again up to a turn of a recorded trajectory, then let a real engine go on.

The teacher's splice (:mod:`acmrl.teacher.splice`) and GRPO's decision groups
(:mod:`acmrl.train.decisions`) both rebuild the State an episode had at one of its turns by
playing its recorded completions back through the real environment and context tools, then
sample from there. A completion is played back as it was recorded (its token ids and why it
ended), so the episode takes the same path: a turn cut at the token limit stays cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from acmrl.engines.base import Completion, Engine, Request
from acmrl.engines.scripted import ScriptedEngine
from acmrl.rollout.records import Trajectory


@dataclass(frozen=True)
class Recorded:
    """A completion as a trajectory recorded it (its token ids and why it ended), replayed as it
    was: a turn cut at the token limit stays cut (a text replayed would end as a plain reply,
    which the agent takes for the final answer)."""

    text: str
    ids: list[int]
    finish: str

    def completion(self, req: Request) -> Completion:
        n = len(self.ids)
        return Completion(
            req.session_id,
            list(self.ids),
            [0.0] * n,
            0,
            self.finish,
            self.text,
            len(req.prompt_ids),
        )


class SpliceEngine(Engine):
    """Scripted replies while a session has some left (texts, or :class:`Recorded` completions
    played back as they were), then the real engine."""

    name = "splice"

    def __init__(
        self, real: Engine, tokenizer: Any, scripts: dict[str, list[str | Recorded]]
    ) -> None:
        self.real = real
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.tokenizer = tokenizer
        self._used: dict[str, int] = {}

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
        live = [r for r in requests if id(r) not in done]
        done |= dict(zip(map(id, live), self.real.generate(live) if live else [], strict=True))
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
            policy.append(Recorded(s.text, s.call.completion_ids, s.call.finish_reason))
        for h in s.helper_calls:
            ids = h.completion_ids
            end = ids[-1:] == [tokenizer.eos_token_id]
            text = tokenizer.decode(ids[:-1] if end else ids, skip_special_tokens=False)
            helpers.setdefault(h.role, []).append(Recorded(text, ids, h.finish_reason))
    return policy, helpers
