"""Decisions made by measuring: the judge, the runtime contest, per-layer profiles, mixed precision
and routing."""
