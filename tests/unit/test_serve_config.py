"""``toolbox serve`` arguments: key=value parsing, engine choice, and the API key a non-loopback bind needs."""

from __future__ import annotations

import pytest

from toolbox.serve import parse_args, secrets_for


def test_options_parse_and_typos_fail() -> None:
    config = parse_args(["model=/m", "port=9000", "max_queue=3"])
    assert (config.port, config.max_queue, config.host) == (9000, 3, "127.0.0.1")
    with pytest.raises(ValueError, match="max_qeue: Extra inputs are not permitted"):
        parse_args(["model=/m", "max_qeue=3"])
    with pytest.raises(ValueError, match="implements engine=hf only; for vllm, `vllm serve"):
        parse_args(["model=/m", "engine=vllm"])


def test_a_public_bind_needs_an_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLBOX_SERVE_API_KEY", raising=False)
    assert secrets_for(parse_args(["model=/m"])) == (None, None)
    with pytest.raises(ValueError, match="host=0.0.0.0 is reachable from other machines: set TOOLBOX_SERVE_API_KEY"):
        secrets_for(parse_args(["model=/m", "host=0.0.0.0"]))
    monkeypatch.setenv("TOOLBOX_SERVE_API_KEY", "k")
    assert secrets_for(parse_args(["model=/m", "host=0.0.0.0"]))[0] == "k"
