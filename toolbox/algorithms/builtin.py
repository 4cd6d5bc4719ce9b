"""The built-in algorithms, registered: the one module whose import fills `ALGORITHMS` with them.

`toolbox.config.algorithm.ALGORITHMS` imports it on its first lookup (as it loads plugins), so the config layer
never imports the algorithms, and nothing else needs to import them for their side effect.
"""

from toolbox.algorithms import dpo, grpo, offline_grpo, online_dpo, ppo, ppo_env, rm, sft  # noqa: F401  (each registers)
