"""Evaluation on its own: scoring a model on a task's eval split (pass@k, rewards, lengths). No Ray here."""

from toolbox.evaluation.metrics import PromptResult, pass_at_k, summarize

__all__ = ["PromptResult", "pass_at_k", "summarize"]
