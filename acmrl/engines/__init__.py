"""engines: not implemented yet (see the open issues)."""
