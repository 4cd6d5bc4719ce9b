"""Options of ``toolbox serve`` (``toolbox serve key=value ...``)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ServeConfig(BaseModel):
    """How to serve a model directory (or a run's exported ``hf/`` directory) over the OpenAI API."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="A Hugging Face model directory or hub id, or a run directory (uses RUN/hf).")
    engine: str = Field("hf", description="A registered engine: `hf` runs the continuous batcher; any other "
                        "(vllm, sglang, ...) is served through its InferenceEngine with dynamic batching.")
    engine_options: dict[str, Any] = Field(default_factory=dict,
                                           description="Options of a non-hf engine (its registry config); on the "
                                           "command line `engine.OPTION=VALUE`.")
    host: str = Field("127.0.0.1", description="Address to bind. Anything but loopback requires an API key.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind (0: any free port).")
    served_model_name: str = Field("", description="The id clients pass as `model`; empty: the `model` value.")
    dtype: str = Field("float32", description="Parameter dtype: float32 or bfloat16.")
    device: str = Field("cpu", description="torch device of the model, e.g. cpu or cuda:0.")
    seed: int = Field(0, description="Seeds the sampler of requests that send no seed.")
    max_batch_size: int = Field(32, ge=1, description="Most choices decoded together in the running batch.")
    weight_bucket_mb: int = Field(256, ge=1, description="Bucket size of a weight push handed to a non-hf engine.")
    max_queue: int = Field(256, ge=0, description="Most choices waiting to join the batch; beyond it a 429.")
    api_key_env: str = Field("TOOLBOX_SERVE_API_KEY", description="Env var holding the API key clients must send.")
    admin_token_env: str = Field("TOOLBOX_SERVE_ADMIN_TOKEN",
                                 description="Env var holding the token of POST /v1/toolbox/weights; unset: disabled.")
    trust_remote_code: bool = Field(False, description="Passed to from_pretrained.")
    log_level: str = Field("info", description="uvicorn's log level.")

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, engine: str) -> str:
        from toolbox.engines import ENGINES  # lazy: the engines import torch and transformers

        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; registered engines: {', '.join(ENGINES.names())}")
        return engine

    @model_validator(mode="after")
    def _engine_options_fit(self) -> ServeConfig:
        from toolbox.core.errors import ConfigError
        from toolbox.engines import ENGINES

        if self.engine == "hf":
            if self.engine_options:
                raise ValueError(f"engine=hf runs the continuous batcher, which takes no engine options (got "
                                 f"{sorted(self.engine_options)}); its options are this config's fields")
            return self
        try:
            ENGINES.validate({"name": self.engine, **self.engine_options}, "engine")
        except ConfigError as err:
            raise ValueError(str(err)) from err
        return self

    def model_dir(self) -> str:
        """``model``, or ``model/hf`` when ``model`` is a run directory holding an exported model."""
        run_export = Path(self.model) / "hf"
        return str(run_export) if (run_export / "config.json").is_file() else self.model

    def model_id(self) -> str:
        return self.served_model_name or self.model

    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False
