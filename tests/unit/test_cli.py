"""The ``toolbox`` console command, and the wheel that installs it with its configs as package data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from toolbox.commands import cli, reference
from toolbox.config import load_config
from toolbox.core.paths import CONFIG_DIR

REPO = Path(__file__).resolve().parents[2]
SUBCOMMANDS = ["run", "train", "tune", "eval", "export", "serve", "model", "plot", "traces", "bench", "deploy", "config", "docs", "components"]


def toolbox_script() -> str:
    """The ``toolbox`` script of the interpreter running the tests (installed by ``pip install -e .``)."""
    script = shutil.which("toolbox", path=str(Path(sys.executable).parent))
    assert script, f"no `toolbox` script beside {sys.executable}: reinstall with `pip install -e .` (make setup)"
    return script


def run_toolbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([toolbox_script(), *args], capture_output=True, text=True, timeout=120, cwd=REPO)


def listed_commands(text: str) -> list[str]:
    """The command names of a usage text's ``commands:`` section, in order."""
    section = text.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in section.splitlines()]


def test_help_lists_every_subcommand_with_one_line_each() -> None:
    done = run_toolbox("--help")
    assert done.returncode == 0, done.stderr
    assert listed_commands(done.stdout) == SUBCOMMANDS
    assert all(len(line.split()) > 2 for line in done.stdout.split("commands:\n", 1)[1].split("\n\n")[0].splitlines())


def test_run_help_is_runs_own_help() -> None:
    done = run_toolbox("run", "--help")
    assert done.returncode == 0, done.stderr
    assert "python -m toolbox.run [experiment=NAME]" in done.stdout + done.stderr


def test_config_prints_the_resolved_experiment_as_yaml() -> None:
    done = run_toolbox("config", "experiment=grpo_tiny", "trainer.total_steps=7")
    assert done.returncode == 0, done.stderr
    data = yaml.safe_load(done.stdout)
    assert data["experiment"] == "grpo_tiny" and data["algorithm"]["name"] == "grpo"
    assert data["trainer"]["total_steps"] == 7


def test_config_error_exits_2_with_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "experiment=no_such_experiment"]) == 2
    err = capsys.readouterr().err
    assert "no_such_experiment" in err and "grpo_tiny" in err  # names the known experiments


@pytest.mark.parametrize("argv", [["nope"], []], ids=["unknown", "none"])
def test_unknown_or_missing_command_exits_2_with_the_list(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert ("unknown command 'nope'" if argv else "no command given") in err
    assert listed_commands(err) == SUBCOMMANDS


def test_subcommands_are_dispatched_with_their_arguments_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    import toolbox.commands.run

    seen: list[list[str]] = []
    monkeypatch.setattr(toolbox.commands.run, "main", lambda argv: seen.append(argv) or 5)
    assert cli.main(["run", "--help", "experiment=x", "a.b=1"]) == 5
    assert seen == [["--help", "experiment=x", "a.b=1"]]


def test_a_missing_command_module_is_a_clear_error_of_that_command(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(cli.COMMANDS, "eval", cli.Command("toolbox.no_such_module:main", "missing"))
    assert cli.main(["eval", "model=x"]) == 1
    assert "toolbox eval: toolbox.no_such_module is not part of this installation" in capsys.readouterr().err
    assert cli.main(["--help"]) == 0  # the other commands are unaffected


def test_tune_help_comes_from_its_docstring(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tune", "--help"]) == 0
    assert "toolbox tune sweep=NAME" in capsys.readouterr().out


def test_docs_writes_only_into_a_source_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference, "DOCS", tmp_path / "site-packages" / "docs")  # where an installed wheel points
    assert cli.main(["docs"]) == 2
    assert not (tmp_path / "site-packages").exists()


def test_experiment_takes_a_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("base: grpo_tiny\ntrainer:\n  total_steps: 3\n")
    cfg = load_config([f"experiment={path}"])
    assert cfg.experiment == "mine" and cfg.trainer.total_steps == 3 and cfg.algorithm.name == "grpo"


def test_config_dir_in_a_checkout_is_the_repositorys_configs() -> None:
    assert CONFIG_DIR == REPO / "configs"
    assert (CONFIG_DIR / "experiments" / "grpo_tiny.yaml").is_file()


# ---- the wheel -------------------------------------------------------------------------------------------

SHIPPED = ("*.yaml", "*.yml", "*.jsonl", "*.json", "*.csv", "*.parquet")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the sources (a build writes build/ and *.egg-info next to them); ~2 s."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("toolbox", "actors", "configs"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("toolbox-*.whl")
    return built


def test_wheel_ships_configs_under_toolbox_and_nothing_at_the_top(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "toolbox/configs/experiments/grpo_tiny.yaml" in names
    assert "toolbox/configs/sweeps/grpo_lr.yaml" in names
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"  # toolbox-0.1.0.dist-info
    assert {name.split("/")[0] for name in names} == {"toolbox", dist_info}
    # Every data file of the repository's configs/ is shipped (a new kind of file needs a package-data pattern).
    repo_files = {f"toolbox/configs/{p.relative_to(REPO / 'configs').as_posix()}"
                  for p in (REPO / "configs").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert repo_files <= set(names), sorted(repo_files - set(names))
    assert all(any(Path(f).match(pattern) for pattern in SHIPPED) for f in repo_files), "add a pattern to pyproject"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "toolbox = toolbox.commands.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_installed_wheel_finds_its_configs(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # a pure wheel unpacked is an install (no script, no RECORD checks)
    probe = ("import toolbox.core.paths as l; from toolbox.config import load_config; "
             "print(l.__file__); print(l.CONFIG_DIR); print(load_config(['experiment=dpo_tiny']).algorithm.name)")
    # PYTHONPATH comes before site-packages, so the unpacked wheel shadows this checkout's editable install.
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    module, config_dir, algorithm = done.stdout.split()
    assert Path(module).is_relative_to(site), module
    assert Path(config_dir) == site / "toolbox" / "configs" and algorithm == "dpo"
