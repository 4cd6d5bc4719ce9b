"""Run the app on a free 127.0.0.1 port in a background thread (tests and ``toolbox.bench serve``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import FastAPI

from toolbox.core.ports import free_port

__all__ = ["free_port", "serve_in_thread"]


@contextmanager
def serve_in_thread(app: FastAPI, port: int, timeout_s: float = 60.0) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1:``port`` until the block ends; yields the ``.../v1`` base URL."""
    import uvicorn

    from toolbox.serving.app import KEEP_ALIVE_S

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_keep_alive=KEEP_ALIVE_S))
    thread = threading.Thread(target=server.run, name="toolbox-serve-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"toolbox serve: the server on 127.0.0.1:{port} did not start within {timeout_s}s")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
