"""A trivially learnable environment for GRPO tests: say the target word.

One task; a plain reply is the answer and scores 1 when it contains ``target``. Tests stop
generation at the target, so a reply either holds it (answered, reward 1) or is cut off at the
token limit (no answer, reward 0): the reward is the chance of saying the word within a few tokens.
Loadable by the CLI as ``env.name=tests.grpo_env:TargetEnv env.options={target: ...}``.
"""

from __future__ import annotations

from acmrl.envs.base import Environment, Task


class TargetEnv(Environment):
    name = "target"

    def __init__(self, target: str = "hung", tasks: int = 1) -> None:
        super().__init__(metric="contains")
        made = [Task(f"t{i}", "Say the magic word.", target, {}) for i in range(tasks)]
        self._tasks = {"train": made, "eval": made}

    def tools(self) -> list:
        return []

    def _handlers(self, task: Task) -> dict:
        return {}


def override(cfg, **kw):
    """Set nested config fields from ``section__field=value`` keywords; returns ``cfg``."""
    for key, value in kw.items():
        obj = cfg
        *path, last = key.split("__")
        for part in path:
            obj = getattr(obj, part)
        setattr(obj, last, value)
    return cfg


def target_word(model_dir) -> tuple[str, int]:
    """The model's second most likely first word of a reply to the task (said now and then, so
    the reward has variance from the first step) and how often it came first in 200 samples."""
    import collections

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from acmrl.config import AgentConfig, SamplingConfig
    from acmrl.engines.base import Request
    from acmrl.engines.hf import HFEngine
    from acmrl.rollout.agent import Episode

    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(model_dir), tok)
    env = TargetEnv()
    ep = Episode(
        "probe", env, env.tasks()[0], "react", tok, agent=AgentConfig(), sampling=SamplingConfig()
    )
    prompt = ep.next_request().prompt_ids
    firsts = engine.generate([Request(f"p{i}", prompt, 1, 1.0, 1.0, [], i) for i in range(200)])
    counts = collections.Counter(c.completion_ids[0] for c in firsts)
    words = [t for t, _ in counts.most_common() if len(tok.decode([t]).strip()) >= 3]
    return tok.decode([words[1]]).strip(), counts[words[1]]
