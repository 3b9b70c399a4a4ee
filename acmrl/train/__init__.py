"""Training: per-turn samples from trajectories (:mod:`acmrl.train.samples`), SFT with soft
supervision (:mod:`acmrl.train.sft`), GRPO on the rollout workers (:mod:`acmrl.train.grpo`),
atomic checkpoints (:mod:`acmrl.train.checkpoint`) and export (:mod:`acmrl.train.export`)."""
