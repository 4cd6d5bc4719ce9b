"""The ``toolbox`` command: ``toolbox COMMAND [args ...]`` (also ``python -m toolbox.commands.cli COMMAND ...``).

``run``, ``tune``, ``eval``, ``export``, ``plot`` and ``bench`` hand their arguments, unchanged, to the ``main(argv)``
of the module of that name in `toolbox.commands` (``bench``: ``toolbox.bench``; each also runs as
``python -m toolbox.commands.NAME``, and ``run`` as ``python -m toolbox.run``); so does ``deploy`` (a KubeRay RayJob
of an experiment or sweep), and ``model`` (`toolbox.commands.model`, the model catalog). The rest live here:

- ``docs``: write docs/configuration.md (every config field) and docs/components.md (every registry entry), as
  `toolbox.commands.reference` renders them.
- ``components``: print the registries.
- ``config [overrides]``: print the resolved config of an experiment as YAML.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One subcommand of ``toolbox``: the ``module:function`` that takes its arguments, and its line of help."""

    target: str
    summary: str
    #: Whether ``function(["--help"])`` prints its own help; if not, ``toolbox NAME --help`` prints the module's
    #: docstring instead (``toolbox.commands.tune`` would read ``--help`` as a malformed override).
    own_help: bool = True


COMMANDS: dict[str, Command] = {
    "run": Command("toolbox.commands.run:main", "run one experiment as one Ray job: [experiment=NAME|PATH] "
                   "[model=|data=|algorithm=NAME] [a.b.c=value ...]"),
    "train": Command("toolbox.commands.run:main", "the same as run"),
    "tune": Command("toolbox.commands.tune:main", "a Ray Tune sweep, each trial one whole experiment: sweep=NAME|PATH [a.b.c=value ...]",
                    own_help=False),
    "eval": Command("toolbox.commands.eval:main", "score a model or a run's policy on a task's eval split (pass@k, mean reward)"),
    "export": Command("toolbox.commands.export:main", "write a run's checkpoint as a Hugging Face model directory: RUN_DIR OUT_DIR"),
    "serve": Command("toolbox.commands.serve:main", "an OpenAI-compatible server of a model or run: model=DIR_OR_RUN [port=8000 ...]"),
    "model": Command("toolbox.commands.model:main", "real pretrained models: fetch NAME | import FILE.gguf OUT_DIR | "
                     "list (the catalog and the model cache)"),
    "plot": Command("toolbox.commands.plot:main", "one dashboard PNG of runs (reward, loss, KL, length, step time): RUN_DIR ... [-o OUT.png]"),
    "traces": Command("toolbox.commands.traces:main", "a run's recorded samples as an SFT or DPO dataset: RUN_DIR --to sft|dpo OUT.jsonl"),
    "bench": Command("toolbox.bench.__main__:main", "benchmarks against TRL / RLlib and of weight sync: NAME [options]"),
    "deploy": Command("toolbox.commands.deploy:main", "render a KubeRay RayJob sized from an experiment or sweep: render "
                      "experiment=NAME|sweep=NAME [a.b.c=value ...] [--image IMG]"),
    "config": Command("toolbox.commands.cli:config_command", "print an experiment's resolved config as YAML (--where: where each "
                      "value came from): [experiment=NAME|PATH] [model=|data=|algorithm=NAME] [a.b.c=value ...]"),
    "docs": Command("toolbox.commands.cli:docs_command", "regenerate docs/configuration.md and docs/components.md"),
    "components": Command("toolbox.commands.cli:components_command", "print every name a config can select (algorithms, engines, rewards, ...)"),
}


def usage() -> str:
    """``toolbox --help``: every subcommand with its line of help."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items()]
    return ("usage: toolbox COMMAND [args ...]\n\ncommands:\n" + "\n".join(lines)
            + "\n\n`toolbox COMMAND --help` shows a command's own help.")


def wants_help(argv: Sequence[str]) -> bool:
    return bool(argv) and argv[0] in {"-h", "--help"}


def config_command(argv: list[str]) -> int:
    """``toolbox config [--where] [experiment=NAME|PATH] [GROUP=NAME ...] [a.b.c=value ...]``: the resolved config as
    YAML, or with ``--where`` one line per value saying where it came from; 2 on a bad config."""
    if wants_help(argv):
        print("usage: toolbox config [--where] [experiment=NAME|PATH] [model=|data=|algorithm=NAME] [a.b.c=value ...]"
              "\n\nPrints the config that `toolbox run` with the same arguments would use, every default filled in, "
              "as YAML; --where prints each value with where it came from (the experiment file, a group fragment, "
              "the command line, or default).")
        return 0
    import yaml

    from toolbox.config.loader import load_config_with_origins, origins
    from toolbox.core.errors import ConfigError

    where = "--where" in argv
    try:
        cfg, layers = load_config_with_origins([a for a in argv if a != "--where"])
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    if not where:
        print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
        return 0
    for path, value, source in origins(cfg, layers):
        print(f"{path}: {json.dumps(value)}  # {source}")
    return 0


def docs_command(argv: list[str]) -> int:
    """``toolbox docs``: write docs/configuration.md and docs/components.md."""
    if argv:
        print(f"usage: toolbox docs\n\n{COMMANDS['docs'].summary}", file=sys.stdout if wants_help(argv) else sys.stderr)
        return 0 if wants_help(argv) else 2
    from toolbox.commands.reference import DOCS, components_markdown, configuration_markdown

    if not (DOCS.parent / "pyproject.toml").is_file():  # an installed wheel: DOCS would be site-packages/docs
        print(f"toolbox docs: {DOCS.parent} is not a source checkout; run it in one", file=sys.stderr)
        return 2
    DOCS.mkdir(exist_ok=True)
    (DOCS / "configuration.md").write_text(configuration_markdown())
    (DOCS / "components.md").write_text(components_markdown())
    print(f"wrote {DOCS / 'configuration.md'} and {DOCS / 'components.md'}")
    return 0


def components_command(argv: list[str]) -> int:
    """``toolbox components``: the component catalog (markdown) on stdout."""
    if argv:
        print(f"usage: toolbox components\n\n{COMMANDS['components'].summary}",
              file=sys.stdout if wants_help(argv) else sys.stderr)
        return 0 if wants_help(argv) else 2
    from toolbox.commands.reference import components_markdown

    print(components_markdown())
    return 0


def dispatch(name: str, argv: list[str]) -> int:
    """Import ``COMMANDS[name]``'s module only now (a missing one is an error of this command alone) and run it."""
    command = COMMANDS[name]
    module_name, _, function = command.target.partition(":")
    from toolbox.core.extras import missing_extra

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or "?"
        what = ("is not part of this installation" if module_name == missing or module_name.startswith(missing + ".")
                else f"needs the package {missing!r}, which is not installed")
        print(missing_extra(err, f"toolbox {name}") or f"toolbox {name}: {module_name} {what} ({err})", file=sys.stderr)
        return 1
    if wants_help(argv) and not command.own_help:
        print(f"usage: toolbox {name} ...\n\n{inspect.getdoc(module) or command.summary}")
        return 0
    try:
        return int(getattr(module, function)(argv))
    except ModuleNotFoundError as err:  # an optional package the command imports only once it needs it
        line = missing_extra(err, f"toolbox {name}")
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """``toolbox COMMAND [args ...]``. Exit codes: the command's own; 2 for a missing or unknown command.

    A hand-written dispatcher rather than argparse subparsers: every command parses its own arguments (dotted
    ``a.b.c=value`` overrides, ``--help``), so the top level only picks a command and forwards the rest verbatim.
    Subparsers would need ``nargs=REMAINDER``, which fails when the first forwarded argument is an option
    (``toolbox run --help``; bpo-17050), or ``parse_known_args``, which re-splits the arguments.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if wants_help(args) or args[:1] == ["help"]:
        print(usage())
        return 0
    if not args or args[0] not in COMMANDS:
        problem = f"unknown command {args[0]!r}" if args else "no command given"
        print(f"toolbox: {problem}\n\n{usage()}", file=sys.stderr)
        return 2
    return dispatch(args[0], args[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
