"""Training: per-turn samples from trajectories (:mod:`acmrl.train.samples`); SFT, GRPO,
checkpoints and export are being built (issue 7)."""
