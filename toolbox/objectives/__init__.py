"""Loss functions. Plain torch: the single source of the math the learners use.

Importing the package registers every built-in loss (`toolbox.objectives.registry` lists the families): each loss
module registers itself, and this is the one place that imports them all.
"""

from toolbox.objectives import cispo, gspo, policy, preference, supervised, value  # noqa: F401  (registrations)
