"""Shared driver loops: the `BaseTrainer.fit` skeleton, the online policy loop, the offline loop.

An algorithm whose loop differs keeps it in its own package under `toolbox.algorithms`.
"""
