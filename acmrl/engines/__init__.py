"""Generation backends behind one protocol (:mod:`acmrl.engines.base`): token ids in, completion
ids, logprobs and the prefix the engine really reused out, for batches of per-session requests.

- ``hf`` (:mod:`acmrl.engines.hf`): transformers, with a KV cache kept per session across turns.
"""

from acmrl.engines.base import Completion, Engine, EngineError, Request

__all__ = ["Completion", "Engine", "EngineError", "Request"]
