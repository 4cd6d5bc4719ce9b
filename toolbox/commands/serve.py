"""``toolbox serve [model=]DIR_OR_RUN [engine=hf|vllm|sglang] [engine.OPTION=VALUE ...] [host=127.0.0.1] [port=8000]``.

An OpenAI-compatible server (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``) of a model
directory, a run's exported ``RUN/hf`` or a fetched catalog model (``model=smollm2-135m-instruct``).
``engine=hf`` (default) runs the continuous batcher (`toolbox.serving.scheduler`); any other registered
engine is driven through its ``InferenceEngine`` with dynamic batching (`toolbox.serving.engine_backend`), its
options given as ``engine.OPTION=VALUE`` (a JSON value, else a string: ``engine.gpu_memory_utilization=0.8``).
Every other option is a field of `toolbox.serving.config.ServeConfig`. Binds 127.0.0.1 unless told; any
other address needs an API key in the env var named by ``api_key_env`` (default TOOLBOX_SERVE_API_KEY), which
clients send as a bearer token. ``POST /v1/toolbox/weights`` loads new weights and is enabled only when the
env var named by ``admin_token_env`` (default TOOLBOX_SERVE_ADMIN_TOKEN) is set. See docs/serving.md.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from toolbox.core.errors import ConfigError
from toolbox.serving.config import ServeConfig

if TYPE_CHECKING:
    from toolbox.serving.server import ServedModel


def _option_value(value: str) -> Any:
    """An engine option's value: JSON when it parses (numbers, booleans, objects), else the string itself."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def parse_args(argv: list[str]) -> ServeConfig:
    """``key=value`` arguments as a `ServeConfig` (``engine.X=V`` into ``engine_options``); `ValueError` naming
    the bad argument or field. A first argument without ``=`` is the model (``toolbox serve RUN_DIR``)."""
    fields: dict[str, Any] = {}
    engine_options: dict[str, Any] = {}
    if argv and "=" not in argv[0]:
        argv = [f"model={argv[0]}", *argv[1:]]
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or not key:
            raise ValueError(f"argument {arg!r} is not key=value; options: {', '.join(ServeConfig.model_fields)}")
        if key.startswith("engine."):
            engine_options[key.removeprefix("engine.")] = _option_value(value)
        else:
            fields[key] = value
    if engine_options:
        fields["engine_options"] = engine_options
    try:
        return ServeConfig.model_validate(fields)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ValueError(problems) from err


def resolve_catalog_model(config: ServeConfig) -> ServeConfig:
    """``model=NAME`` of the model catalog as its fetched directory, still served under the id NAME; any other
    ``model`` unchanged. `ConfigError` naming ``model`` and the fetch command when NAME is not fetched yet."""
    from toolbox.models.catalog import resolve

    path = resolve(config.model, field="model")
    if path == config.model:
        return config
    return config.model_copy(update={"model": path, "served_model_name": config.served_model_name or config.model})


def secrets_for(config: ServeConfig) -> tuple[str | None, str | None]:
    """The API key and admin token from the environment; `ValueError` if a non-loopback bind has no key."""
    api_key = os.environ.get(config.api_key_env) or None
    if api_key is None and not config.is_loopback():
        raise ValueError(f"host={config.host} is reachable from other machines: set {config.api_key_env} to an API "
                         "key (clients send it as Authorization: Bearer KEY), or bind host=127.0.0.1")
    return api_key, os.environ.get(config.admin_token_env) or None


def build_server(config: ServeConfig) -> ServedModel:
    """The continuous batcher for ``engine=hf``, else the engine backend over the registered engine."""
    if config.engine == "hf":
        from toolbox.serving.server import ModelServer

        return ModelServer(config)
    from toolbox.serving.engine_backend import EngineServer

    return EngineServer(config)


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted. Exit codes: 0 after a clean shutdown, 2 on bad arguments."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    try:
        config = resolve_catalog_model(parse_args(args))
        api_key, admin_token = secrets_for(config)
    except (ValueError, ConfigError) as err:
        print(f"toolbox serve: {err}", file=sys.stderr)
        return 2
    import uvicorn

    from toolbox.serving.app import KEEP_ALIVE_S, create_app

    try:
        server = build_server(config)
    except ImportError as err:  # engine=vllm|sglang where the package is not installed
        print(f"toolbox serve: engine={config.engine} needs a package that is not installed here: {err}",
              file=sys.stderr)
        return 2
    app = create_app(server, api_key, admin_token)
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level, timeout_keep_alive=KEEP_ALIVE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
