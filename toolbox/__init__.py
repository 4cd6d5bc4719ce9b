"""toolbox: Ray-orchestrated post-training for language models and classic RL."""

__version__ = "0.1.0"
