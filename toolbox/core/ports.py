"""A free local TCP port, for the servers, Ray heads and benches toolbox starts on 127.0.0.1."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port nothing listens on right now, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
