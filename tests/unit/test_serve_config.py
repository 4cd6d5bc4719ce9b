"""``toolbox serve`` arguments: key=value parsing, engine choice, and the API key a non-loopback bind needs."""

from __future__ import annotations

import pytest

from toolbox.commands.serve import main, parse_args, secrets_for


def test_options_parse_and_typos_fail() -> None:
    config = parse_args(["model=/m", "port=9000", "max_queue=3"])
    assert (config.port, config.max_queue, config.host) == (9000, 3, "127.0.0.1")
    with pytest.raises(ValueError, match="max_qeue: Extra inputs are not permitted"):
        parse_args(["model=/m", "max_qeue=3"])
    with pytest.raises(ValueError, match="unknown engine 'vlm'; registered engines: .*hf.*sglang.*vllm"):
        parse_args(["model=/m", "engine=vlm"])


def test_other_engines_take_dotted_options_checked_against_their_config() -> None:
    config = parse_args(["model=/m", "engine=vllm", "engine.gpu_memory_utilization=0.8", "engine.seeded=false"])
    assert (config.engine, config.engine_options) == ("vllm", {"gpu_memory_utilization": 0.8, "seeded": False})
    with pytest.raises(ValueError, match="gpu_memory_utilisation"):
        parse_args(["model=/m", "engine=vllm", "engine.gpu_memory_utilisation=0.8"])
    with pytest.raises(ValueError, match="engine=hf runs the continuous batcher, which takes no engine options"):
        parse_args(["model=/m", "engine.max_batch_size=4"])


def test_unknown_engine_exits_2_listing_the_registered_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model=/m", "engine=nope"]) == 2
    assert "registered engines: " in capsys.readouterr().err


def test_a_public_bind_needs_an_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLBOX_SERVE_API_KEY", raising=False)
    assert secrets_for(parse_args(["model=/m"])) == (None, None)
    with pytest.raises(ValueError, match="host=0.0.0.0 is reachable from other machines: set TOOLBOX_SERVE_API_KEY"):
        secrets_for(parse_args(["model=/m", "host=0.0.0.0"]))
    monkeypatch.setenv("TOOLBOX_SERVE_API_KEY", "k")
    assert secrets_for(parse_args(["model=/m", "host=0.0.0.0"]))[0] == "k"


def test_a_bare_first_argument_is_the_model() -> None:
    assert parse_args(["runs/r1", "port=9001"]).model == "runs/r1"
    with pytest.raises(ValueError, match="argument 'runs/r2' is not key=value"):
        parse_args(["model=/m", "runs/r2"])  # only the first may be bare


def test_the_server_keeps_idle_connections_longer_than_the_clients_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client closes an idle keep-alive connection first: a server closing it at the same moment as the
    client's pool (httpx: 5 s) resets a request sent into that moment."""
    import httpx
    import uvicorn
    from fastapi import FastAPI

    from toolbox.commands import serve

    seen: dict[str, object] = {}
    monkeypatch.setattr(serve, "build_server", lambda config: object())
    monkeypatch.setattr("toolbox.serving.app.create_app", lambda *args: FastAPI())
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(kwargs))
    assert main(["model=/m"]) == 0
    assert seen["timeout_keep_alive"] > httpx.Limits().keepalive_expiry  # type: ignore[operator]
