"""Options of ``toolbox serve`` (``python -m toolbox.serve key=value ...``)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

ENGINES_ELSEWHERE = {
    "vllm": "`vllm serve MODEL_DIR` is already an OpenAI-compatible server with continuous batching",
    "sglang": "`python -m sglang.launch_server --model-path MODEL_DIR` is already an OpenAI-compatible server",
}


class ServeConfig(BaseModel):
    """How to serve a model directory (or a run's exported ``hf/`` directory) over the OpenAI API."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="A Hugging Face model directory or hub id, or a run directory (uses RUN/hf).")
    engine: str = Field("hf", description="Generation backend; this server implements `hf` (transformers).")
    host: str = Field("127.0.0.1", description="Address to bind. Anything but loopback requires an API key.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind (0: any free port).")
    served_model_name: str = Field("", description="The id clients pass as `model`; empty: the `model` value.")
    dtype: str = Field("float32", description="Parameter dtype: float32 or bfloat16.")
    device: str = Field("cpu", description="torch device of the model, e.g. cpu or cuda:0.")
    seed: int = Field(0, description="Seeds the sampler of requests that send no seed.")
    max_batch_size: int = Field(32, ge=1, description="Most choices decoded together in the running batch.")
    max_queue: int = Field(256, ge=0, description="Most choices waiting to join the batch; beyond it a 429.")
    api_key_env: str = Field("TOOLBOX_SERVE_API_KEY", description="Env var holding the API key clients must send.")
    admin_token_env: str = Field("TOOLBOX_SERVE_ADMIN_TOKEN",
                                 description="Env var holding the token of POST /v1/toolbox/weights; unset: disabled.")
    trust_remote_code: bool = Field(False, description="Passed to from_pretrained.")
    log_level: str = Field("info", description="uvicorn's log level.")

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, engine: str) -> str:
        if engine in ENGINES_ELSEWHERE:
            raise ValueError(f"toolbox serve implements engine=hf only; for {engine}, {ENGINES_ELSEWHERE[engine]} "
                             "(point the http engine at it)")
        if engine != "hf":
            raise ValueError(f"unknown engine {engine!r}; toolbox serve implements: hf")
        return engine

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
