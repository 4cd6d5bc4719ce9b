"""Throughput of ``toolbox serve`` beside raw ``transformers`` ``generate`` on the same model, in the same run.

``python -m toolbox.bench serve [--model DIR] [--max-tokens 32] [--rounds 4] [--concurrency 1,8,32] [--threads 1]``

For each concurrency c, c client threads (the official ``openai`` client) each send ``rounds`` completions of
``max_tokens`` tokens (EOS ignored, so every answer has the same length) to a server on 127.0.0.1; the baseline
runs ``model.generate`` on a batch of c of the same prompts, ``rounds`` times, with the same token count. Both
count only generated tokens. Without ``--model`` a tiny random Qwen2 is built in a temporary directory.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch


def _tiny_model(root: Path) -> str:
    from toolbox.data.tasks import TASKS
    from toolbox.models.loading import TinyModelConfig
    from toolbox.models.tiny import ensure_tiny_model

    alphabet = TASKS.build({"name": "digit_add"}).alphabet()
    return str(ensure_tiny_model(root / "tiny", TinyModelConfig(), alphabet))


def bench_server(url: str, model: str, concurrency: int, rounds: int, max_tokens: int) -> tuple[float, int]:
    """(seconds, generated tokens) for ``concurrency`` clients each sending ``rounds`` requests."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)

    def one_client(i: int) -> int:
        tokens = 0
        for r in range(rounds):
            out = client.completions.create(model=model, prompt=f"{i}+{r}=", max_tokens=max_tokens, seed=i * rounds + r,
                                            extra_body={"ignore_eos": True})
            tokens += out.usage.completion_tokens if out.usage else 0
        return tokens

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(one_client, range(concurrency)))
    return time.perf_counter() - start, tokens


@torch.no_grad()
def bench_generate(model_dir: str, concurrency: int, rounds: int, max_tokens: int) -> tuple[float, int]:
    """(seconds, generated tokens) for ``rounds`` ``model.generate`` calls on batches of ``concurrency`` prompts."""
    from toolbox.models.loading import load_causal_lm, load_tokenizer

    tok, model = load_tokenizer(model_dir), load_causal_lm(model_dir).eval()
    tok.padding_side = "left"
    start, tokens = time.perf_counter(), 0
    for r in range(rounds):
        batch = tok([f"{i}+{r}=" for i in range(concurrency)], return_tensors="pt", padding=True,
                    add_special_tokens=False)
        out = model.generate(**batch, do_sample=True, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             top_k=None, pad_token_id=tok.pad_token_id)
        tokens += (out.shape[1] - batch["input_ids"].shape[1]) * concurrency
    return time.perf_counter() - start, tokens


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench serve", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="", help="model directory; empty: a tiny random Qwen2")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4, help="requests per client (batches for generate)")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, for both sides (one process: server and baseline share it)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from rich.console import Console
    from rich.table import Table

    from toolbox.serving.app import create_app
    from toolbox.serving.background import free_port, serve_in_thread
    from toolbox.serving.config import ServeConfig
    from toolbox.serving.server import ModelServer

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or _tiny_model(Path(tmp))
        config = ServeConfig(model=model_dir, port=free_port(), max_batch_size=64)
        table = Table(title=f"toolbox serve vs transformers generate ({args.max_tokens} tokens per request)")
        for column in ("clients", "what", "requests/s", "tokens/s"):
            table.add_column(column, justify="right")
        ratios = []
        with serve_in_thread(create_app(ModelServer(config)), config.port) as url:
            bench_server(url, config.model_id(), 1, 1, 4)  # warm-up
            for c in (int(x) for x in args.concurrency.split(",")):
                s_sec, s_tok = bench_server(url, config.model_id(), c, args.rounds, args.max_tokens)
                g_sec, g_tok = bench_generate(model_dir, c, args.rounds, args.max_tokens)
                requests = c * args.rounds
                table.add_row(str(c), "toolbox serve", f"{requests / s_sec:.1f}", f"{s_tok / s_sec:.0f}")
                table.add_row(str(c), "generate", f"{requests / g_sec:.1f}", f"{g_tok / g_sec:.0f}")
                ratios.append(f"ratio c={c}: serve / generate tokens/s = {(s_tok / s_sec) / (g_tok / g_sec):.2f}")
        console = Console()
        console.print(table)
        for line in ratios:
            console.print(line)
    return 0
