"""The documentation site builds with ``mkdocs build --strict`` (what ``make docs-site`` and CI run).

Strict mode turns every warning into a failure: a broken link or anchor, a nav entry without a page, a page
left out of the nav, a snippet (``--8<--``) whose file is gone. The second test shows that the repository's
``validation`` settings do fail such a site, so the first cannot pass by accident of a lax config.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra (pip install -e .[docs]) is not installed")
pytest.importorskip("material", reason="the docs extra (pip install -e .[docs]) is not installed")

REPO = Path(__file__).resolve().parents[2]


def mkdocs_build(config: Path, site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent)})


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site", REPO)

    assert done.returncode == 0, done.stderr[-3000:]
    troubleshooting = (tmp_path / "site" / "troubleshooting" / "index.html").read_text()
    assert "batch arithmetic: algorithm.prompts_per_step x algorithm.group_size" in troubleshooting  # the catalog
    assert "the multi_turn engine wraps a generating engine" in troubleshooting  # a ValueError an actor raises
    grpo = (tmp_path / "site" / "algorithms" / "grpo" / "index.html").read_text()
    assert "algorithm.loss.clip_high" in grpo and "digit_add" in grpo  # its fields and its recipe, from the code


def test_a_broken_link_or_a_page_outside_the_nav_fails(tmp_path: Path) -> None:
    from mkdocs.utils.yaml import yaml_load

    with (REPO / "mkdocs.yml").open() as f:
        validation = yaml_load(f)["validation"]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the missing page](missing.md).\n")
    (docs / "orphan.md").write_text("# Not in the nav\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"site_name: t\nnav:\n  - index.md\nvalidation: {validation!r}\n".replace("'", '"'))

    done = mkdocs_build(config, tmp_path / "site", tmp_path)

    assert done.returncode != 0
    assert "contains a link 'missing.md', but the target is not found" in done.stderr
    assert 'not included in the "nav" configuration:\n  - orphan.md' in done.stderr
    assert "Aborted with 2 warnings in strict mode" in done.stdout + done.stderr
