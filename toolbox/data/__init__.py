"""Prompt sources and built-in verifiable tasks."""
