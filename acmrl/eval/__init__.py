"""``acmrl eval``: run a model over an environment's eval split per arm and write a report."""
