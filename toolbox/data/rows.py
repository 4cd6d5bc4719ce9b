"""Reading a table of rows from any source the `datasets` library reads, and screening out malformed rows.

`read_rows` turns a path into numbered rows (plain dicts): a ``.jsonl`` file line by line (so a
row of the wrong type, which Arrow cannot hold in one column, still gets its line number); a
``.json`` / ``.parquet`` / ``.csv`` file, a directory written by ``save_to_disk`` or any other
directory of data files, and a hub id through ``datasets.load_dataset`` / ``load_from_disk``. Row
numbers are 1-based: the line of a JSONL file, the record index otherwise (a CSV header is not a
row). `screen` applies a row check to every row and the ``data.on_bad_row`` policy to what fails.

Not covered: streaming (a split is read whole into memory), remote files other than hub ids.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from toolbox.core.errors import ConfigError

T = TypeVar("T")
Row = tuple[int, Any]  # (1-based row number, the row as read)
log = logging.getLogger(__name__)
BUILDERS = {".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}  # .txt: {"text"} documents
MAX_LISTED = 20


class DataConfig(BaseModel):
    """What to do with malformed rows of every dataset the experiment reads (prompts and offline records)."""

    model_config = ConfigDict(extra="forbid")
    on_bad_row: Literal["error", "skip"] = Field(
        "error", description="A malformed row (missing field, wrong type, empty text, too long): 'error' stops "
        "before training and lists up to 20 of them with file:row; 'skip' drops them and says how many at start.")
    on_overflow: Literal["warn", "error"] = Field(
        "warn", description="An offline record longer than algorithm.max_length tokens: 'warn' cuts it at the end and "
        "says at start how many were cut (and which rows); 'error' makes it a bad row (see on_bad_row).")


class RowError(Exception):
    """One row is malformed; the message says what is wrong (the caller adds file:row)."""


@dataclass(frozen=True)
class BadRow:
    """A row that failed its check."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def is_local(path: str) -> bool:
    """Whether ``path`` names a local file or directory (as opposed to a hub id)."""
    return Path(path).expanduser().exists() or path.startswith((".", "/", "~")) or Path(path).suffix in {*BUILDERS, ".jsonl"}


def local_path(path: str) -> Path:
    """``path`` made absolute: from the working directory, or else from the folder holding the shipped
    ``configs/`` (the repository, or the installed package), so a shipped recipe's ``./configs/data/...``
    resolves wherever the run starts."""
    from toolbox.core.paths import CONFIG_DIR

    here = Path(path).expanduser()
    shipped = CONFIG_DIR.parent / here
    if not here.is_absolute() and not here.exists() and shipped.exists():
        return shipped.resolve()
    return here.resolve()


def read_rows(path: str, split: str = "train") -> list[Row]:
    """Every row of ``split`` of ``path`` (a local file, a local directory or a hub id), numbered from 1."""
    if not is_local(path):
        return _hub_rows(path, split)
    local = Path(path).expanduser().resolve()
    if not local.exists():
        raise ConfigError(f"{local}: dataset file not found")
    stamp = local.stat().st_mtime_ns
    return list(_local_rows(str(local), split, stamp))


@functools.lru_cache(maxsize=16)
def _local_rows(path: str, split: str, stamp: int) -> tuple[Row, ...]:
    """Cached per (path, split, modification time): the driver reads a file for the config check and the run."""
    local = Path(path)
    if local.is_dir():
        return tuple(_numbered(_load_directory(local, split)))
    if split != "train":
        raise ConfigError(f"{local}: a single file has only the 'train' split, not {split!r} "
                          "(hold prompts out with eval_fraction instead)")
    if local.suffix == ".jsonl":
        return tuple(_jsonl_rows(local))
    builder = BUILDERS.get(local.suffix)
    if builder is None:
        raise ConfigError(f"{local}: unknown file type {local.suffix!r}; allowed: .jsonl, {', '.join(BUILDERS)}, "
                          "or a directory written by save_to_disk")
    return tuple(_numbered(_guarded(local, lambda: _load_file(builder, local))))


def _hub_rows(name: str, split: str) -> list[Row]:
    import datasets

    return _numbered(_guarded(name, lambda: datasets.load_dataset(name, split=split)))


def _load_file(builder: str, path: Path) -> Any:
    import datasets

    # A .txt file holds raw-text documents separated by blank lines, each a {"text": ...} row.
    options = {"sample_by": "paragraph"} if builder == "text" else {}
    table = datasets.load_dataset(builder, data_files=str(path), split="train", **options)
    if builder == "csv":  # CSV cells are text: keep "42" a string rather than the integer pandas infers
        table = table.cast(datasets.Features({name: datasets.Value("string") for name in table.column_names}))
    return table


def _load_directory(path: Path, split: str) -> Any:
    """A ``save_to_disk`` directory (a Dataset or a DatasetDict), else a directory of data files."""
    import datasets

    if not any((path / name).exists() for name in ("dataset_info.json", "dataset_dict.json", "state.json")):
        return _guarded(path, lambda: datasets.load_dataset(str(path), split=split))
    loaded = _guarded(path, lambda: datasets.load_from_disk(str(path)))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ConfigError(f"{path}: no split {split!r}; splits: {sorted(loaded)}")
        return loaded[split]
    if split != "train":
        raise ConfigError(f"{path}: holds one split (a Dataset), asked for {split!r}; use 'train' and eval_fraction")
    return loaded


def _guarded(where: str | Path, load: Callable[[], Any]) -> Any:
    """``load()``, with the library's error turned into one that names the source."""
    try:
        return load()
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - datasets raises many types; all mean "cannot read this source"
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"{where}: cannot read it with the datasets library: {type(err).__name__}: {first}") from None


def _numbered(table: Any) -> list[Row]:
    """Rows of a `datasets.Dataset`, numbered from 1, with the nulls Arrow fills in for absent keys removed."""
    return [(i, _drop_nulls(row)) for i, row in enumerate(table, start=1)]


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _jsonl_rows(path: Path) -> list[Row]:
    """Each non-blank line of a JSONL file; invalid JSON fails at once (the rest of the file cannot be trusted)."""
    out: list[Row] = []
    with path.open(encoding="utf-8") as f:
        for row, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append((row, json.loads(line)))
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{row}: not valid JSON: {err.msg} (column {err.colno})") from None
    return out


def screen(rows: Sequence[Row], check: Callable[[Any], T], source: str, on_bad_row: str = "error") -> list[T]:
    """``check(row)`` for every row; rows whose check raises `RowError` are bad.

    ``error``: raise one `ConfigError` listing up to 20 bad rows as ``source:row: what``. ``skip``: drop them
    and log how many (at start, where the data is read). No usable row at all is an error either way.
    """
    good: list[T] = []
    bad: list[BadRow] = []
    for row, value in rows:
        try:
            good.append(check(value))
        except RowError as err:
            bad.append(BadRow(f"{source}:{row}", str(err)))
    if bad and on_bad_row == "error":
        raise ConfigError(bad_rows_message(bad, len(rows)))
    if bad:
        log.warning("data: skipped %d of %d rows of %s (data.on_bad_row=skip); first: %s", len(bad), len(rows),
                    source, bad[0])
    if not good:
        raise ConfigError(f"{source}: no records" + (f" ({len(bad)} bad rows skipped)" if bad else ""))
    return good


def bad_rows_message(bad: Sequence[BadRow], total: int) -> str:
    """One bad row on one line; several as a list of at most 20, with the count and the way out."""
    hint = " (data.on_bad_row=skip drops bad rows)"
    if len(bad) == 1:
        return f"{bad[0]}{hint}"
    listed = "\n  ".join(str(b) for b in bad[:MAX_LISTED])
    more = f"\n  ... and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
    return f"{len(bad)} of {total} rows are malformed{hint}:\n  {listed}{more}"


def text_field(row: Any, key: str, what: str = "") -> str:
    """``row[key]`` as a non-empty string, or a `RowError` saying what is wrong with it."""
    if not isinstance(row, dict):
        raise RowError(f"a record must be a JSON object (a mapping of fields), got {type(row).__name__}")
    if key not in row:
        raise RowError(f"field {key!r} is missing{what} (fields: {sorted(row)})")
    value = row[key]
    if not isinstance(value, str):
        raise RowError(f"field {key!r} must be a string, got {type(value).__name__} (fields: {sorted(row)})")
    if not value.strip():
        raise RowError(f"field {key!r} is empty")
    return value
