"""Objective families: which losses each trainer accepts, and the error when a config mixes them up."""

from __future__ import annotations

OBJECTIVE_FAMILIES: dict[str, tuple[str, ...]] = {
    "supervised": ("sft", "seq"),
    "preference": ("sigmoid", "ipo", "hinge"),
    "policy": ("grpo", "dr_grpo", "dapo", "ppo_clip", "reinforce_pp", "rloo"),
    "value": ("value_mse",),
}


def family_of(objective: str) -> str | None:
    """The family an objective name belongs to, or None if no family knows it."""
    return next((fam for fam, names in OBJECTIVE_FAMILIES.items() if objective in names), None)


def check_objective(objective: str, family: str, trainer: str) -> str:
    """Return ``objective`` if it is in ``family``; else raise a ValueError that names both sides."""
    allowed = OBJECTIVE_FAMILIES[family]
    if objective in allowed:
        return objective
    other = family_of(objective)
    what = f"is a {other} objective" if other else "is not a known objective"
    raise ValueError(f"{objective!r} {what}; the {trainer!r} trainer takes {family} objectives: {', '.join(allowed)}")
