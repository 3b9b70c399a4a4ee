"""Generation backends behind one protocol (:mod:`acmrl.engines.base`): token ids in, completion
ids, logprobs and the prefix the engine really reused out, for batches of per-session requests.

- ``hf`` (:mod:`acmrl.engines.hf`): transformers, with a KV cache kept per session across turns;
- ``vllm`` (:mod:`acmrl.engines.vllm`): vLLM's offline engine with automatic prefix caching;
- ``openai`` (:mod:`acmrl.engines.openai`): any OpenAI-compatible completions server, several
  with session affinity;
- ``scripted`` (:mod:`acmrl.engines.scripted`): replies from a Python function (the teacher's
  expert plan, tests);
- :mod:`acmrl.engines.server`: ``acmrl serve``, an OpenAI-compatible server in front of any engine.
"""

from acmrl.engines.base import Completion, Engine, EngineError, Request

__all__ = ["Completion", "Engine", "EngineError", "Request"]
