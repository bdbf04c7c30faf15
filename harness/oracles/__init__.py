"""Oracles: each module answers one question about a run (its first docstring line asks it)."""
