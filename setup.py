"""Package layout: every ``toolbox*`` package, plus the top-level ``actors/`` folder installed as ``toolbox.actors``.

The Ray boundary sits visibly outside the library (``actors/``) while the wheel keeps one import name.
Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["toolbox", "toolbox.*"]), "toolbox.actors"],
    package_dir={"toolbox.actors": "actors"},
)
