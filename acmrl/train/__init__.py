"""train: not implemented yet (see the open issues)."""
