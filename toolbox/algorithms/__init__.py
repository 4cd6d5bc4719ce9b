"""One home per algorithm: its config, its checks, its learner, its wiring of roles, and its loop where it differs.

``ALGORITHMS`` maps ``algorithm.name`` to an entry whose ``config`` is the algorithm's
config class (the config union is built from it) and whose factory wires the run:
``(ExperimentBuilder, EventBus) -> BaseTrainer``. A package adds an algorithm through
the ``toolbox.plugins`` entry point by registering one more entry (see
docs/adding-an-algorithm.md); nothing in toolbox needs an edit.
"""

from toolbox.algorithms.base import ALGORITHMS, Wiring, register_algorithm

__all__ = ["ALGORITHMS", "Wiring", "register_algorithm"]

from toolbox.algorithms import dpo, grpo, offline_grpo, online_dpo, ppo, ppo_env, rm, sft  # noqa: E402,F401  (registers built-ins)
