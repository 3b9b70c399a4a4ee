"""The agent's working memory: State and its validation, rendering to tokens and parsing back,
the evolve sandbox, the per-episode archive, and prefix/cache-cost arithmetic.

This package imports nothing else from acmrl; everything else builds on it.
"""
