"""transformers' lazy-import map read from a file (`toolbox.core.import_cache`)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from transformers.utils.import_utils import create_import_structure_from_path, define_import_structure

from toolbox.core import import_cache
from toolbox.core.import_cache import cached, decode, encode, stamp

PROBE = textwrap.dedent("""
    import json, sys
    import toolbox
    import transformers.utils.import_utils as utils
    built = []
    real = utils.create_import_structure_from_path
    utils.create_import_structure_from_path = lambda path: built.append(path) or real(path)
    from transformers import LlamaConfig, PreTrainedTokenizerFast  # resolved through the lazy map
    import transformers.models.llama.modeling_llama
    print(json.dumps({"built": len(built), "cached": getattr(utils.define_import_structure, "_toolbox_cached", False),
                      "config": LlamaConfig.__name__}))
""")


def probe(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_a_second_process_reads_transformers_map_instead_of_building_it(tmp_path: Path) -> None:
    first = probe({import_cache.ENV: str(tmp_path)})
    second = probe({import_cache.ENV: str(tmp_path)})
    off = probe({import_cache.ENV: "off"})
    assert first["cached"] and first["built"] > 0
    assert second == {"built": 0, "cached": True, "config": "LlamaConfig"}  # every map from the file
    assert not off["cached"] and off["built"] > 0
    (file,) = tmp_path.glob("transformers-*.json")
    keys = [json.loads(key) for key in json.loads(file.read_text())]
    assert any(directory.endswith("transformers/models") and prefix == "models" for directory, prefix in keys)


def write_module(directory: Path, names: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "__init__.py").write_text("")
    (directory / "configuration_x.py").write_text(f"__all__ = {names!r}\n")


def counting_real(calls: list[str]):  # noqa: ANN201
    real = inspect.unwrap(define_import_structure)  # past this module's cache and transformers' in-process one

    def define(module_path, prefix=None):  # noqa: ANN001, ANN202
        calls.append(str(module_path))
        return real(module_path, prefix)

    return define


def test_the_map_is_the_one_transformers_builds_and_follows_an_edited_module(tmp_path: Path) -> None:
    package, calls = tmp_path / "models" / "x", []
    write_module(package, ["XConfig"])
    define = cached(counting_real(calls), "9.9", tmp_path / "cache")
    first = define(tmp_path / "models", "models")
    assert first == {frozenset(): {"models.x.configuration_x": {"XConfig"}}}
    stamp.cache_clear()
    assert define(tmp_path / "models", "models") == first and len(calls) == 1  # read back, not built
    assert define(tmp_path / "models") == {frozenset(): {"x.configuration_x": {"XConfig"}}} and len(calls) == 2
    write_module(package, ["XConfig", "YConfig"])
    os.utime(package / "configuration_x.py", ns=(1, stamp(str(tmp_path / "models"))[0] + 1))
    stamp.cache_clear()
    create_import_structure_from_path.cache_clear()  # transformers' own cache, for the life of a process
    assert define(tmp_path / "models", "models") == {frozenset(): {"models.x.configuration_x": {"XConfig", "YConfig"}}}
    assert len(calls) == 3


def test_a_broken_cache_file_is_built_again(tmp_path: Path) -> None:
    write_module(tmp_path / "models" / "x", ["XConfig"])
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "transformers-9.9.json").write_text("{not json")
    calls: list[str] = []
    define = cached(counting_real(calls), "9.9", tmp_path / "cache")
    assert define(tmp_path / "models") == {frozenset(): {"x.configuration_x": {"XConfig"}}} and len(calls) == 1
    assert json.loads((tmp_path / "cache" / "transformers-9.9.json").read_text())  # whole again


def test_backends_and_names_survive_the_file() -> None:
    structure = {frozenset({"torch", "tokenizers"}): {"a.modeling_a": {"A", "B"}}, frozenset(): {"a.configuration_a": {"C"}}}
    assert decode(json.loads(json.dumps(encode(structure)))) == structure


@pytest.mark.parametrize("value, expected", [("off", None), ("OFF", None), ("0", None), ("/x/y", Path("/x/y"))])
def test_the_cache_directory_setting(monkeypatch: pytest.MonkeyPatch, value: str, expected: Path | None) -> None:
    monkeypatch.setenv(import_cache.ENV, value)
    assert import_cache.cache_dir() == expected


def test_the_default_cache_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(import_cache.ENV, raising=False)
    assert import_cache.cache_dir() == Path("~/.cache/toolbox/imports").expanduser()


def test_processes_writing_at_once_keep_each_others_entries(tmp_path: Path) -> None:
    for name in "abc":
        write_module(tmp_path / name / "x", [name.upper()])
    calls: list[str] = []
    first, second = (cached(counting_real(calls), "9.9", tmp_path / "cache") for _ in range(2))
    second(tmp_path / "c")  # `second` holds the file as it was then: c only
    first(tmp_path / "a")
    second(tmp_path / "b")  # reads again before writing: a stays
    kept = json.loads((tmp_path / "cache" / "transformers-9.9.json").read_text())
    assert {json.loads(key)[0] for key in kept} == {str((tmp_path / name).resolve()) for name in "abc"}
    assert len(calls) == 3


def test_an_unwritable_cache_still_answers(tmp_path: Path) -> None:
    write_module(tmp_path / "models" / "x", ["XConfig"])
    (tmp_path / "not-a-dir").write_text("")
    define = cached(counting_real([]), "9.9", tmp_path / "not-a-dir")
    assert define(tmp_path / "models") == {frozenset(): {"x.configuration_x": {"XConfig"}}}
