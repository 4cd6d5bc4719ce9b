"""The generated reference docs match the code (regenerate with `make docs`)."""

from __future__ import annotations

from toolbox.cli import DOCS, components_markdown, configuration_markdown


def test_configuration_reference_is_current() -> None:
    assert (DOCS / "configuration.md").read_text() == configuration_markdown(), "run `make docs` and commit"


def test_component_catalog_is_current() -> None:
    assert (DOCS / "components.md").read_text() == components_markdown(), "run `make docs` and commit"
