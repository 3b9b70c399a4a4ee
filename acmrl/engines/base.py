"""The engine protocol: token ids in, completion ids + logprobs + reused prefix out, batched.

Every request carries a session id, so an engine can keep that session's prefix cache across turns
(the transformers engine keeps its KV cache, vLLM and servers their prefix caches) and report how
many prompt tokens it actually reused. Engines know nothing of States, tools or environments.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar


class EngineError(RuntimeError):
    """A request the engine cannot serve (prompt too long, server unreachable after retries)."""


@dataclass
class Request:
    session_id: str
    prompt_ids: list[int]
    max_tokens: int = 128
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)  # strings that end the completion (kept in it)
    seed: int | None = None  # per-request sampling seed: the same seed gives the same sample
    # OpenAI's structured-output field (acmrl/engines/structured.py); None: free text
    response_format: dict | None = None


@dataclass
class Completion:
    session_id: str
    completion_ids: list[int]
    # log-probability of each completion token under the sampling distribution (logits / T, or
    # the raw logits when greedy), before top-p truncation
    logprobs: list[float]
    cached_prefix_tokens: int  # prompt tokens the engine reused instead of recomputing
    finish_reason: str  # "stop" (end of turn or a stop string) or "length"
    text: str
    prompt_tokens: int
    wall_s: float = 0.0


class Engine(ABC):
    """Generates completions for batches of requests.

    Besides generation, an engine owns its lifecycle beside a trainer (GRPO), through optional
    methods whose defaults suit an engine that samples the trainer's own parameters in-process:
    :meth:`sleep` and :meth:`wake_up` around an update (free accelerator memory),
    :meth:`policy_updated` after it (drop what the old policy computed), and, for an engine that
    serves a copy of the policy (:attr:`loads_policy`), :meth:`load_adapter` to take the new one.
    """

    name = "engine"
    #: the engine serves its own copy of the policy, which a trainer must hand it after each
    #: update (:meth:`load_adapter`, or a full-weight sync into its servers); False: it
    #: samples the trainer's live parameters (or a copy the trainer refreshes)
    loads_policy: ClassVar[bool] = False

    @abstractmethod
    def generate(self, requests: list[Request]) -> list[Completion]:
        """One completion per request, in order."""

    def release(self, session_id: str) -> None:  # noqa: B027 - optional for stateless engines
        """Forget a finished session's cached prefix."""

    def close(self) -> None:  # noqa: B027 - optional
        """Free resources (models, connections, servers)."""

    def sleep(self) -> None:  # noqa: B027 - optional
        """Free accelerator memory while a trainer updates the policy (colocated engines)."""

    def wake_up(self) -> None:  # noqa: B027 - optional
        """Take the memory back after :meth:`sleep`."""

    def policy_updated(self) -> None:  # noqa: B027 - optional
        """The policy's parameters changed: nothing computed with the old ones may be reused."""

    def load_adapter(self, path: str) -> None:
        """Serve the LoRA adapter in ``path`` from now on (engines that :attr:`loads_policy`)."""
        raise EngineError(f"the {self.name} engine does not load adapters")
