"""``mixture``: the tasks of several environments as one, e.g. ``kb_search`` worlds of many seeds.

A student trained on one generated world can learn that world's names instead of the skill;
training on many worlds (and evaluating on a world it never saw) tells the two apart. Each
task keeps its own environment: its session, tools, scoring and oracle plan are that
environment's, so the mixture adds nothing but the routing.

>>> env = load_mixture("kb_search", seeds=[1, 2], options={"preset": "tiny"})
>>> len(env.tasks("train")), env.tasks("train")[16].id
(32, 'kb_search/tiny/s2/train/00000')
"""

from __future__ import annotations

from typing import Any

from acmrl.envs.base import EnvError, Environment, Evidence, Plan, Session, Task
from acmrl.envs.scoring import Judge


class Mixture(Environment):
    """Options: ``envs``, a list of ``{"name": ..., "options": {...}}``; or ``env`` (a name)
    with ``seeds`` (one environment per seed) and the shared ``options``."""

    name = "mixture"

    def __init__(
        self,
        envs: list[dict[str, Any]] | None = None,
        *,
        env: str | None = None,
        seeds: list[int] | None = None,
        options: dict[str, Any] | None = None,
        judge: Judge | None = None,
    ) -> None:
        super().__init__(judge=judge)
        from acmrl.envs import load

        if envs is None:
            if env is None or not seeds:
                raise EnvError("mixture needs envs=[{name, options}, ...], or env and seeds")
            envs = [{"name": env, "options": {**(options or {}), "seed": s}} for s in seeds]
        if not envs:
            raise EnvError("mixture needs at least one environment")
        extra = {"judge": judge} if judge is not None else {}  # every member scores with it
        self.members = [load(e["name"], **e.get("options", {}), **extra) for e in envs]
        self.name = "+".join(dict.fromkeys(m.name for m in self.members))
        self._owner: dict[str, Environment] = {}
        for member in self.members:
            for split in member.splits:
                self._tasks.setdefault(split, [])  # a member's empty split is the mixture's too
                for task in member.tasks(split):
                    # a member's task may sit in two of its splits (code_nav's eval and dev)
                    if self._owner.get(task.id, member) is not member:
                        raise EnvError(f"mixture: task id {task.id!r} occurs twice")
                    self._owner[task.id] = member
                    self._tasks[split].append(task)
        budgets = {m.max_context_tokens for m in self.members}
        self.max_context_tokens = min(b for b in budgets if b) if any(budgets) else None
        self.documents = [d for m in self.members for d in getattr(m, "documents", []) or []]
        self.read_tools = tuple(dict.fromkeys(t for m in self.members for t in m.read_tools))

    def _of(self, task: Task) -> Environment:
        try:
            return self._owner[task.id]
        except KeyError:
            raise EnvError(f"task {task.id!r} is not one of this mixture's") from None

    def tools(self) -> list[dict[str, Any]]:
        return self.members[0].tools()

    def session(self, task: Task) -> Session:
        return self._of(task).session(task)

    def oracle_plan(self, task: Task) -> Plan:
        return self._of(task).oracle_plan(task)

    def key_terms(self, task: Task) -> list[str]:
        return self._of(task).key_terms(task)

    def answer_evidence(self, task: Task) -> list[Evidence]:
        return self._of(task).answer_evidence(task)

    def notes_of(self, task: Task, result: str) -> list[str] | None:
        return self._of(task).notes_of(task, result)

    def score(self, task: Task, answer: str | None) -> float:
        return self._of(task).score(task, answer)


def load_mixture(env: str, seeds: list[int], options: dict[str, Any]) -> Mixture:
    return Mixture(env=env, seeds=seeds, options=options)
