"""The rollout side: the agent loop of one episode (:mod:`acmrl.rollout.agent`, a sans-IO state
machine), the workers that run many episodes with their model calls batched
(:mod:`acmrl.rollout.worker`), trajectory records (:mod:`acmrl.rollout.records`), the system
prompts (:mod:`acmrl.rollout.prompts`), the judge and environment loading
(:mod:`acmrl.rollout.judge`), the environment a config names (:mod:`acmrl.rollout.environment`)
and the ``acmrl rollout`` command's table (:mod:`acmrl.rollout.run`)."""
