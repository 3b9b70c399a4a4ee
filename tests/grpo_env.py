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
