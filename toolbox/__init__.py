"""toolbox: Ray-orchestrated post-training for language models and classic RL."""

from toolbox.core.import_cache import install as _cache_transformers_imports

__version__ = "0.1.0"

_cache_transformers_imports()  # before any toolbox module imports transformers (`toolbox.core.import_cache`)
