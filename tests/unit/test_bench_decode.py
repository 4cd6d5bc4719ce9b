"""`python -m toolbox.bench decode`'s harness on a small case: every path runs, alternating, and samples the same tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolbox.bench.decode import PATHS, Case, main, run_case


def test_every_path_samples_the_same_tokens_and_is_timed(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "tiny").symlink_to(tiny_model_dir)  # the session's tiny model, not a new one
    result = run_case("tiny_eos", Case("tiny", prompts=4, samples=2, max_new_tokens=5, eos_bias=2.0), tmp_path,
                      rounds=2, repeats=1)
    assert result["same_tokens"] is True and result["rows"] == 8 and result["tokens_per_call"] > 8
    for path in PATHS:
        assert len(result[f"{path}_rounds_s"]) == 2 and result[f"{path}_s"] > 0
        assert result[f"{path}_speedup"] == pytest.approx(result["generate_s"] / result[f"{path}_s"])


def test_unknown_case_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--cases", "small,huge"])
    assert "--cases: unknown ['huge']" in capsys.readouterr().err
