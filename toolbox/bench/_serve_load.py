"""The load generator of ``toolbox bench serve``, in a process of its own: c concurrent clients on aiohttp.

Reads one JSON job per stdin line (``url, model, concurrency, rounds, max_tokens, stream``) and answers one JSON
line: the wall seconds of the whole job, the completion tokens, and per request its latency and (streamed) the
time to its first token. A process of its own so that the clients neither share the server's GIL nor take its
time slices in that process; aiohttp rather than the ``openai`` client because it spends a fraction of the CPU per
request (the tests drive the server with the ``openai`` client).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any


async def _request(session: Any, url: str, body: dict[str, Any]) -> tuple[float, float, int]:
    """(latency, time to the first token or 0 when not streamed, completion tokens) of one request."""
    start = time.perf_counter()
    async with session.post(url, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"the server answered {response.status}: {await response.text()}")
        if not body["stream"]:
            usage = (await response.json())["usage"]
            return time.perf_counter() - start, 0.0, int(usage["completion_tokens"])
        first, tokens, pending = 0.0, 0, b""
        async for piece in response.content.iter_any():
            pending += piece
            *events, pending = pending.split(b"\n\n")
            for event in events:
                if event.startswith(b"data: {"):
                    first = first or time.perf_counter() - start
                    tokens += 1  # the server sends one token per chunk
    return time.perf_counter() - start, first, tokens


async def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """``concurrency`` clients, each sending ``rounds`` completions one after another."""
    import aiohttp

    url = job["url"] + "/completions"
    rounds = job["rounds"]

    async def client(session: Any, i: int) -> list[tuple[float, float, int]]:
        out = []
        for r in range(rounds):
            body = {"model": job["model"], "prompt": f"{i}+{r}=", "max_tokens": job["max_tokens"],
                    "seed": i * rounds + r, "ignore_eos": True, "stream": job["stream"]}
            out.append(await _request(session, url, body))
        return out

    connector = aiohttp.TCPConnector(limit=job["concurrency"])
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        per_client = await asyncio.gather(*(client(session, i) for i in range(job["concurrency"])))
        seconds = time.perf_counter() - start
    done = [r for rs in per_client for r in rs]
    return {"seconds": seconds, "tokens": sum(r[2] for r in done), "latency": [r[0] for r in done],
            "ttft": [r[1] for r in done]}


def main() -> None:
    for line in sys.stdin:
        print(json.dumps(asyncio.run(run_job(json.loads(line)))), flush=True)


if __name__ == "__main__":
    main()
