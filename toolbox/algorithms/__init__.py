"""One home per algorithm: its config, its checks, its learner, its wiring of roles, and its loop where it differs.

``ALGORITHMS`` (defined in `toolbox.config.algorithm`, below this package) maps ``algorithm.name`` to an entry
whose ``config`` is the algorithm's config class (the config union is built from it) and whose factory wires
the run: ``ExperimentBuilder -> AlgorithmPlan`` (`toolbox.algorithms.plan`), which the builder starts. The built-in algorithms register in
`toolbox.algorithms.builtin`, which the registry imports on its first lookup; a package adds an algorithm
through the ``toolbox.plugins`` entry point by registering one more entry (see docs/adding-an-algorithm.md);
nothing in toolbox needs an edit. Importing this package registers nothing by itself.
"""

from toolbox.algorithms.base import Wiring
from toolbox.algorithms.plan import AlgorithmPlan, LearnerPlan, RolePlan, Workers
from toolbox.config.algorithm import ALGORITHMS, register_algorithm

__all__ = ["ALGORITHMS", "AlgorithmPlan", "LearnerPlan", "RolePlan", "Wiring", "Workers", "register_algorithm"]
