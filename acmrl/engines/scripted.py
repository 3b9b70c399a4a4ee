"""An engine whose replies come from a Python function: expert demonstrations and tests.

``ScriptedEngine(tokenizer, reply)`` answers each request with ``reply(session_id, prompt_text)``,
tokenised and ended with the end-of-turn token, so the agent loop, the environment and the context
tools run for real around a known policy: the oracle's plan replayed as tool calls, or a scripted
sequence of compactions. Logprobs are 0 (the script is certain) and nothing is cached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from acmrl.engines.base import Completion, Engine, Request


class ScriptedEngine(Engine):
    name = "scripted"

    def __init__(
        self, tokenizer: Any, reply: Callable[[str, str], str], *, truncate: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.truncate = truncate  # False: a script's reply is never cut at max_tokens

    def generate(self, requests: list[Request]) -> list[Completion]:
        out = []
        for req in requests:
            text = self.reply(req.session_id, self.tokenizer.decode(req.prompt_ids))
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if self.truncate:
                ids = ids[: req.max_tokens]
            finish = "length" if self.truncate and len(ids) == req.max_tokens else "stop"
            if finish == "stop":
                ids.append(self.tokenizer.eos_token_id)
            else:
                text = self.tokenizer.decode(ids)
            out.append(
                Completion(
                    req.session_id,
                    ids,
                    [0.0] * len(ids),
                    0,
                    finish,
                    text,
                    len(req.prompt_ids),
                )
            )
        return out


def replay(scripts: dict[str, list[str]]) -> Callable[[str, str], str]:
    """A reply function that plays each session's texts in order (``session_id`` -> texts)."""
    position: dict[str, int] = {}

    def reply(session_id: str, prompt: str) -> str:
        i = position.get(session_id, 0)
        position[session_id] = i + 1
        texts = scripts[session_id]
        return texts[i] if i < len(texts) else texts[-1]

    return reply
