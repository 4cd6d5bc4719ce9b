"""What the http engine asks of a server beyond completions: whether it is our own (`toolbox serve`, ``GET
{base_url}/toolbox/info``) and takes weight pushes, the safetensors body a push posts, and the errors that say why
a push failed or a server did not answer. Plain ``urllib``: the probe runs once at start and a push is one POST."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from toolbox.engines.common import (
    tensor_bytes,
)
from toolbox.rl.weights import WeightBucket, unpack_all

PROBE_TIMEOUT_S = 10.0  # the info probe is tiny; do not wait the completion timeout for it


@dataclass(frozen=True)
class ServerInfo:
    """What ``GET <base_url>/toolbox/info`` said. ``ours`` is False for any other server; ``note`` says why."""

    ours: bool
    weight_update: bool = False
    model: str = ""
    note: str = ""
    status: int = 200


class ServerUnreachableError(RuntimeError):
    """The server did not answer at all (refused connection, timeout, DNS)."""


class PushFailedError(RuntimeError):
    """A weight push answered with a status worth sending it again for (408, 5xx)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"status {status}: {snippet(body)}")
        self.status, self.body = status, body


def http_request(url: str, *, method: str = "GET", headers: dict[str, str] | None = None, body: bytes | None = None,
          timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int, bytes]:
    """One request with the standard library; returns (status, body) for any HTTP answer, 4xx/5xx included.

    A connection failure raises `ServerUnreachableError`. Nothing about the request's headers is logged.
    """
    request = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - http(s) URL from config
            return int(response.status), response.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise ServerUnreachableError(f"{method} {url}: no answer ({reason})") from None


def probe_server(base_url: str, api_key: str, timeout_s: float = PROBE_TIMEOUT_S) -> ServerInfo:
    """Ask whether ``base_url`` is a `toolbox serve` server and whether it takes weight pushes.

    Any answer other than 200 with toolbox's info JSON (404 from vLLM, 501 from a bare server, 401 from a
    server that wants another key) means "not ours", with the reason kept in ``note`` for the refusal
    message. A server that does not answer at all raises `ServerUnreachableError`.
    """
    url = f"{base_url.rstrip('/')}/toolbox/info"
    status, body = http_request(url, headers={"Authorization": f"Bearer {api_key}"}, timeout_s=timeout_s)
    if status != 200:
        return ServerInfo(ours=False, note=f"GET {url} answered {status}", status=status)
    try:
        info = json.loads(body)
        return ServerInfo(ours=True, weight_update=info["weight_update"] is True, model=str(info.get("model", "")),
                          note=f"GET {url}: weight_update={info['weight_update']!r}")
    except (ValueError, KeyError, TypeError):
        return ServerInfo(ours=False, note=f"GET {url} answered 200 but not toolbox's info JSON: {snippet(body)}")


def stale_weights_message(base_url: str, why: str) -> str:
    """Why training cannot use the server at ``base_url`` (``why``), and the ways out."""
    return (f"the http engine's server at {base_url} does not take the learner's weight updates ({why}), so "
            "training would keep sampling from a stale policy. Serve the model with toolbox serve "
            "(TOOLBOX_SERVE_ADMIN_TOKEN set on the server and the rollout workers), use the vllm or sglang engine, "
            "or set rollout.engine.allow_stale_weights: true to sample from a fixed policy on purpose")


def snippet(body: bytes, limit: int = 300) -> str:
    return body[:limit].decode("utf-8", "replace")


def safetensors_payload(buckets: list[WeightBucket]) -> tuple[bytes, int, int]:
    """The buckets' tensors as one safetensors file: (bytes, tensor count, tensor bytes).

    Tensors that share memory (tied embeddings exported from one process) are cloned, since
    safetensors refuses to save aliases; everything else is serialized straight from the bucket views.
    """
    from safetensors.torch import save

    state = unpack_all(buckets)
    seen: set[int] = set()
    for name, tensor in state.items():
        ptr = tensor.untyped_storage().data_ptr() if tensor.numel() else 0
        if ptr and ptr in seen:
            state[name] = tensor.clone()
        seen.add(ptr)
    return save(state), len(state), tensor_bytes(state.values())
