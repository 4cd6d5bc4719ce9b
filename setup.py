"""Package layout: every ``toolbox*`` package, plus two top-level folders installed under ``toolbox``.

- ``actors/`` installs as ``toolbox.actors``: the Ray boundary sits visibly outside the library while the
  wheel keeps one import name.
- ``configs/`` (experiment and sweep YAMLs, small data files) installs as ``toolbox/configs/``, package data
  only (no ``__init__.py``; the file patterns are in pyproject.toml). The repository's ``configs/`` stays the
  one source of truth and the wheel puts no top-level ``configs`` into site-packages;
  ``toolbox.config.loader.CONFIG_DIR`` finds either place.

Everything else is in pyproject.toml.
"""

from setuptools import find_namespace_packages, find_packages, setup

# Every folder under configs/ is listed (as a data-only namespace package): setuptools otherwise warns that a
# data folder it copies "would be ignored" as a package.
CONFIG_PACKAGES = ["toolbox.configs", *(f"toolbox.configs.{p}" for p in find_namespace_packages(where="configs"))]

setup(
    packages=[*find_packages(include=["toolbox", "toolbox.*"]), "toolbox.actors", *CONFIG_PACKAGES],
    package_dir={"toolbox.actors": "actors", "toolbox.configs": "configs"},
)
