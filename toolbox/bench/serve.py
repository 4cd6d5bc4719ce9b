"""Throughput and latency of ``toolbox serve`` beside raw ``transformers`` ``generate`` on the same model, in one run.

``python -m toolbox.bench serve [--model DIR] [--max-tokens 32] [--rounds 8] [--repeats 3] [--concurrency 1,8,32]
[--threads 1]``

For each concurrency c, c clients (`toolbox.bench._serve_load`, a process of its own) each send ``rounds``
completions of ``max_tokens`` tokens (EOS ignored, so every answer has the same length) to a server on
127.0.0.1, once as plain requests (tokens/s, request latency) and once streamed (time to first token); the
baseline runs ``model.generate`` on a batch of c of the same prompts, ``rounds`` times. Both count generated
tokens only. The two sides alternate (server first, then generate first, ...) ``repeats`` times, so a change
in the machine's load hits both; the ratio is taken per repeat and reported as its median and range, with the
load average. Without ``--model`` a tiny random Qwen2 is built in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


def _tiny_model(root: Path) -> str:
    from toolbox.data.tasks import TASKS
    from toolbox.models.loading import TinyModelConfig
    from toolbox.models.tiny import ensure_tiny_model

    alphabet = TASKS.build({"name": "digit_add"}).alphabet()
    return str(ensure_tiny_model(root / "tiny", TinyModelConfig(), alphabet))


class LoadClients:
    """The load-generator process: one job (a concurrency, plain or streamed) per call."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.process = subprocess.Popen([sys.executable, "-m", "toolbox.bench._serve_load"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)

    def run(self, concurrency: int, rounds: int, max_tokens: int, stream: bool) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        job = {"url": self.url, "model": self.model, "concurrency": concurrency, "rounds": rounds,
               "max_tokens": max_tokens, "stream": stream}
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the load generator exited ({self.process.wait()}) on {job}")
        return dict(json.loads(line))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)


def generate_seconds(model: Any, tok: Any, concurrency: int, rounds: int, max_tokens: int) -> tuple[float, int]:
    """(seconds, generated tokens) of ``rounds`` ``model.generate`` calls on batches of ``concurrency`` prompts."""
    start, tokens = time.perf_counter(), 0
    with torch.no_grad():
        for r in range(rounds):
            batch = tok([f"{i}+{r}=" for i in range(concurrency)], return_tensors="pt", padding=True,
                        add_special_tokens=False)
            out = model.generate(**batch, do_sample=True, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 top_k=None, pad_token_id=tok.pad_token_id)
            tokens += (out.shape[1] - batch["input_ids"].shape[1]) * concurrency
    return time.perf_counter() - start, tokens


@dataclass
class Row:
    """One concurrency's measurements over the repeats."""

    serve: list[float] = field(default_factory=list)  # tokens/s
    generate: list[float] = field(default_factory=list)
    stream: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)  # seconds, every request
    ttft: list[float] = field(default_factory=list)


def measure(clients: LoadClients, generate: Callable[[int], tuple[float, int]], concurrency: int, rounds: int,
            max_tokens: int, repeats: int) -> Row:
    """``repeats`` alternations of the server (plain, then streamed) and ``generate`` at one concurrency."""
    row = Row()
    for repeat in range(repeats):
        sides = ["serve", "generate"] if repeat % 2 == 0 else ["generate", "serve"]
        for side in sides:
            if side == "generate":
                seconds, tokens = generate(concurrency)
                row.generate.append(tokens / seconds)
                continue
            plain = clients.run(concurrency, rounds, max_tokens, stream=False)
            streamed = clients.run(concurrency, rounds, max_tokens, stream=True)
            row.serve.append(plain["tokens"] / plain["seconds"])
            row.stream.append(streamed["tokens"] / streamed["seconds"])
            row.latency += plain["latency"]
            row.ttft += streamed["ttft"]
        row.ratio.append(row.serve[-1] / row.generate[-1])
    return row


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _span(values: list[float], fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(min(values))}-{fmt.format(max(values))}"


def report(rows: dict[int, Row], max_tokens: int, load: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"toolbox serve vs transformers generate ({max_tokens} tokens per request)")
    for column in ("clients", "serve tok/s", "generate tok/s", "ratio (median, range)", "stream tok/s",
                   "TTFT p50/p99 ms", "latency p50/p99 ms"):
        table.add_column(column, justify="right")
    for c, row in rows.items():
        ms = [f"{1000 * percentile(v, 0.5):.1f}/{1000 * percentile(v, 0.99):.1f}" for v in (row.ttft, row.latency)]
        table.add_row(str(c), _span(row.serve), _span(row.generate),
                      f"{statistics.median(row.ratio):.2f} ({_span(row.ratio, '{:.2f}')})", _span(row.stream), *ms)
    console = Console(width=160)
    console.print(table)
    before, after = (" ".join(f"{x:.2f}" for x in avg) for avg in load)
    console.print(f"load average (1, 5, 15 min): before {before}, after {after}")
    for c, row in rows.items():
        console.print(f"ratio c={c}: serve / generate tokens/s = {statistics.median(row.ratio):.2f} "
                      f"(range {_span(row.ratio, '{:.2f}')}), TTFT p50 {1000 * percentile(row.ttft, 0.5):.1f} ms")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench serve", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="", help="model directory; empty: a tiny random Qwen2")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=8, help="requests per client (batches for generate)")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the two sides per concurrency")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, for both sides (one process: server and baseline share it)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from toolbox.models.loading import load_causal_lm, load_tokenizer
    from toolbox.serving.app import create_app
    from toolbox.serving.background import free_port, serve_in_thread
    from toolbox.serving.config import ServeConfig
    from toolbox.serving.server import ModelServer

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or _tiny_model(Path(tmp))
        config = ServeConfig(model=model_dir, port=free_port(), max_batch_size=64)
        tok, model = load_tokenizer(model_dir), load_causal_lm(model_dir).eval()
        tok.padding_side = "left"

        def generate(c: int) -> tuple[float, int]:
            return generate_seconds(model, tok, c, args.rounds, args.max_tokens)

        before, rows = os.getloadavg(), {}
        with serve_in_thread(create_app(ModelServer(config)), config.port) as url:
            clients = LoadClients(url, config.model_id())
            try:
                clients.run(2, 1, 4, stream=True)  # warm-up: both paths
                generate(2)
                for c in (int(x) for x in args.concurrency.split(",")):
                    rows[c] = measure(clients, generate, c, args.rounds, args.max_tokens, args.repeats)
            finally:
                clients.close()
        report(rows, args.max_tokens, (before, os.getloadavg()))
    return 0
