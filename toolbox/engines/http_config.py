"""Options of the ``http`` engine (`HTTPEngineConfig`): the server, its key (or the variable that holds it; a saved
config shows a mask), concurrency, retries, how token ids come back, and whether a training run can push weights
to the server (``check_training``, asked before any actor starts)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_serializer, field_validator

from toolbox.core.errors import ConfigError
from toolbox.engines.http_server import ServerUnreachableError, probe_server, stale_weights_message

NO_KEY = "EMPTY"  # the placeholder key local servers accept: not a secret
MASK = "**********"  # what a saved config shows in place of a real key


class HTTPEngineConfig(BaseModel):
    """Options of the ``http`` engine (an OpenAI-compatible completions server)."""

    model_config = ConfigDict(extra="forbid")
    base_url: str = Field(default="http://127.0.0.1:8000/v1", description="Server URL up to and including /v1.")
    api_key: SecretStr = Field(default=SecretStr(NO_KEY), description="Bearer token (default EMPTY: local vLLM/SGLang "
                               "servers accept any value). Kept secret: config.yaml, `toolbox config` and trackers show it masked, "
                               "so a run resumed from its config.yaml needs the key again; prefer api_key_env.")
    api_key_env: str = Field(
        default="", pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$",
        description="Name of the environment variable (on the rollout workers) holding the API key; set: it "
        "replaces api_key (toolbox serve's is TOOLBOX_SERVE_API_KEY).",
    )
    model: str = Field(default="", description="Model name the server serves; empty: the model path.")
    timeout_s: float = Field(default=600.0, gt=0.0,
                             description="Seconds one completion request (or one weight upload) may take.")
    max_concurrency: int = Field(default=32, ge=1, description="Completion requests in flight at once.")
    max_retries: int = Field(default=2, ge=0, description="Retries of a failed request (no connection, a timeout, a "
                             "408 or 5xx answer), by the one retry policy; a 429 (busy) is waited out until timeout_s.")
    server_token_ids: bool = Field(
        default=True,
        description="Ask the server for the sampled token ids (see token_ids_field) so text need not be "
        "re-tokenized; turn off for a server that rejects unknown request fields.",
    )
    token_ids_field: Literal["return_token_ids", "return_tokens_as_token_ids"] = Field(
        default="return_token_ids",
        description="Request field that asks for token ids: return_token_ids (toolbox serve, recent vLLM: "
        "choices[].token_ids) or return_tokens_as_token_ids (older vLLM: tokens spelled token_id:N).",
    )
    n_per_prompt: bool = Field(
        default=True,
        description="Ask for the samples of one prompt (a GRPO group) in one request with n (independent choices; "
        "toolbox serve seeds choice i with seed + i); off: one request per sample, for servers that reject n > 1 with log-probs.",
    )
    seeded: bool = Field(
        default=True, description="Send each request its own seed (reproducible where the server honours it)."
    )
    push_weights: bool = Field(
        default=True,
        description="Push the learner's weights to a server that advertises toolbox's weight-update endpoint "
        "(GET <base_url>/toolbox/info); off: treat it like any other server.",
    )
    admin_token_env: str = Field(
        default="TOOLBOX_SERVE_ADMIN_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable (on the rollout workers) holding the server's admin "
        "token for weight pushes; never the token itself.",
    )
    allow_stale_weights: bool = Field(
        default=False,
        description="Let update_weights return without loading when the server cannot take weights (the "
        "server keeps its own): only for sampling from a fixed policy.",
    )

    @field_validator("api_key")
    @classmethod
    def _not_the_mask(cls, key: SecretStr) -> SecretStr:
        if key.get_secret_value() == MASK:
            raise ValueError("this is the mask a saved config shows in place of the key, not a key: put the key in "
                             "an environment variable and set rollout.engine.api_key_env to its name")
        return key

    @field_serializer("api_key", when_used="json")
    def _masked(self, key: SecretStr) -> str:
        """The key as config.yaml and `toolbox config` show it: masked (the placeholder ``EMPTY`` is no secret)."""
        return NO_KEY if key.get_secret_value() == NO_KEY else MASK

    def training_problem(self, probe: bool = False) -> str:
        """Why a training run (which must load the learner's weights into the server every step) cannot use this
        engine; empty when it can or cannot be told. ``probe``: also ask the server (`probe_server`); a server
        that does not answer, or refuses the request's key, cannot be told (the rollout worker asks again)."""
        if self.allow_stale_weights:
            return ""
        if not self.push_weights:
            return "rollout.engine.push_weights is false"
        if not probe:
            return ""
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else self.api_key.get_secret_value()
        try:
            info = probe_server(self.base_url, key)
        except ServerUnreachableError:
            return ""
        if info.ours and not info.weight_update:
            return f"{info.note}: start toolbox serve with TOOLBOX_SERVE_ADMIN_TOKEN set"
        return "" if info.ours or info.status in (401, 403) else info.note

    def check_training(self, probe: bool = False) -> None:
        """`ConfigError` naming the fix when a training run cannot load its weights into the server."""
        problem = self.training_problem(probe)
        if problem:
            raise ConfigError(f"rollout.engine: {stale_weights_message(self.base_url, problem)}")
