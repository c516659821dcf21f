"""Measure `goose serve`: per-request overhead against in-process decoding, and a mixed concurrent load.

    .venv/bin/python scripts/serve_load.py --rounds 5 --out serve-results.json

1. Overhead. The same 128-token chat request (``ignore_eos``, so every run is exactly 128
   tokens) runs alternately through `goose generate`'s code path in this process
   (``GooseDecoder.generate``, in the main thread as `goose generate` runs it, and in a worker
   thread as the server runs it) and through the server (non-streamed and streamed, with the real
   `openai` client). Reported: the median client-side latency of each against the median
   in-process time, and the server's own overhead, client latency minus the decoding time the
   server measured for that request (``goose.wall_s``), which does not depend on how fast decoding
   happened to be while the machine was shared.
2. Load. ``--clients`` concurrent clients each send ``--requests`` requests (chat and
   completions, streamed and not; every fourth is malformed): throughput, p50/p95 latency of the
   valid ones, and a check that every valid answer equals the greedy reference and every bad one
   is a 400.

The server is started here (`python -m goose serve`, 127.0.0.1, a free port) unless ``--url`` names one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import torch

from goose import models
from goose.cycle.decoder import GooseDecoder

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Write a Python function that merges two sorted lists."
LOAD_PROMPTS = ["Name three rivers.", "What is 2 + 2?", "Say hello in French.", "Name a colour."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--url", default=None, help="an already running server (default: start one)")
    parser.add_argument("--rounds", type=int, default=5, help="overhead: timed rounds (after one warm-up)")
    parser.add_argument("--tokens", type=int, default=128, help="overhead: tokens per request")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=4, help="load: requests per client")
    parser.add_argument("--load-tokens", type=int, default=32, help="load: max_tokens per request")
    parser.add_argument("--direct", default="main,worker",
                        help="in-process baselines: main (the thread `goose generate` decodes in), worker (a thread, "
                        "like the server's), or both")
    parser.add_argument("--max-batch", type=int, default=None,
                        help="the started server's --max-batch (default: goose serve's own default)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with _server(args) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=os.environ.get("GOOSE_API_KEY", "none"),
                               max_retries=0, timeout=600)
        overhead = None
        if args.rounds > 0:  # --rounds 0: the load alone
            model, tokenizer = models.load(args.model, dtype=args.dtype, progress=False)
            decoder = GooseDecoder(model, tokenizer)
            baselines = [name.strip() for name in args.direct.split(",") if name.strip()]
            overhead = measure_overhead(client, decoder, args.rounds, args.tokens, baselines, args.threads)
            del model, decoder
        load = measure_load(client, url, args.clients, args.requests, args.load_tokens)
    report = {"model": args.model, "dtype": args.dtype, "threads": args.threads, "cpus": os.cpu_count(),
              "max_batch": args.max_batch, "overhead": overhead, "load": load}
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


def measure_overhead(client: openai.OpenAI, decoder: GooseDecoder, rounds: int, tokens: int,
                     baselines: list[str], threads: int) -> dict[str, Any]:
    messages = [{"role": "user", "content": PROMPT}]
    request = {"model": "goose", "messages": messages, "max_tokens": tokens, "temperature": 0,
               "extra_body": {"ignore_eos": True}}
    times: dict[str, list[float]] = {f"direct_{name}": [] for name in baselines} | {"server": [], "server_stream": []}
    server_overhead: list[float] = []
    texts = set()

    def direct(where: str) -> float:
        result: list[Any] = []

        def run() -> None:
            torch.set_num_threads(threads)
            started = time.perf_counter()
            generated = decoder.generate(PROMPT, tokens, eos_token_ids=())
            result.extend([time.perf_counter() - started, generated])

        if where == "main":
            run()
        else:
            worker = threading.Thread(target=run)
            worker.start()
            worker.join()
        seconds, generated = result
        assert len(generated.new_token_ids) == tokens
        texts.add(generated.text)
        return seconds

    for round_ in range(rounds + 1):  # round 0 warms every path up
        measured = {f"direct_{name}": direct(name) for name in baselines}

        started = time.perf_counter()
        whole = client.chat.completions.create(**request)
        measured["server"] = time.perf_counter() - started

        started = time.perf_counter()
        chunks = list(client.chat.completions.create(stream=True, **request))
        measured["server_stream"] = time.perf_counter() - started

        assert whole.usage.completion_tokens == tokens
        texts |= {whole.choices[0].message.content,
                  "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)}
        if round_:
            for name, seconds in measured.items():
                times[name].append(seconds)
            server_overhead.append(measured["server"] - whole.model_extra["goose"]["wall_s"])
        print(f"round {round_}: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in measured.items()),
              file=sys.stderr)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "tokens": tokens, "rounds": rounds, "identical_text": len(texts) == 1,
        "median_s": {name: round(value, 4) for name, value in medians.items()},
        **{f"server_vs_{name}": round(medians["server"] / medians[name] - 1, 4) for name in medians
           if name.startswith("direct_")},
        **{f"stream_vs_{name}": round(medians["server_stream"] / medians[name] - 1, 4) for name in medians
           if name.startswith("direct_")},
        "server_own_overhead_ms": round(1000 * statistics.median(server_overhead), 2),
        "server_own_overhead_share": round(statistics.median(server_overhead) / medians["server"], 5),
    }


def measure_load(client: openai.OpenAI, url: str, clients: int, requests: int, tokens: int) -> dict[str, Any]:
    # the reference: each prompt answered alone, before the load (greedy, so any correct answer equals it)
    expected_chat = {prompt: client.chat.completions.create(
        model="goose", messages=[{"role": "user", "content": prompt}], max_tokens=tokens,
    ).choices[0].message.content for prompt in LOAD_PROMPTS}
    expected_completion = {prompt: client.completions.create(model="goose", prompt=prompt, max_tokens=tokens)
                           .choices[0].text for prompt in LOAD_PROMPTS}

    def one_client(index: int) -> list[dict[str, Any]]:
        outcomes = []
        for step in range(requests):
            prompt = LOAD_PROMPTS[(index + step) % len(LOAD_PROMPTS)]
            kind = ("chat", "chat_stream", "completion_stream", "malformed")[(index + step) % 4]
            started = time.perf_counter()
            if kind == "malformed":
                response = httpx.post(url + "/v1/chat/completions", json={"messages": [], "max_tokens": tokens},
                                      headers={"Authorization": f"Bearer {client.api_key}"}, timeout=600)
                outcomes.append({"kind": kind, "ok": response.status_code == 400,
                                 "latency_s": time.perf_counter() - started, "tokens": 0})
                continue
            messages = [{"role": "user", "content": prompt}]
            if kind == "chat":
                response = client.chat.completions.create(model="goose", messages=messages, max_tokens=tokens)
                text, produced = response.choices[0].message.content, response.usage.completion_tokens
                ok = text == expected_chat[prompt]
            elif kind == "chat_stream":
                chunks = list(client.chat.completions.create(model="goose", messages=messages, max_tokens=tokens,
                                                             stream=True))
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                produced, ok = chunks[-1].usage.completion_tokens, text == expected_chat[prompt]
            else:
                chunks = list(client.completions.create(model="goose", prompt=prompt, max_tokens=tokens,
                                                        stream=True))
                text = "".join(c.choices[0].text for c in chunks if c.choices)
                produced, ok = chunks[-1].usage.completion_tokens, text == expected_completion[prompt]
            outcomes.append({"kind": kind, "ok": ok, "latency_s": time.perf_counter() - started, "tokens": produced})
        return outcomes

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        outcomes = [o for per_client in pool.map(one_client, range(clients), timeout=3600) for o in per_client]
    wall_s = time.perf_counter() - started
    valid = [o for o in outcomes if o["kind"] != "malformed"]
    latencies = sorted(o["latency_s"] for o in valid)
    generated = sum(o["tokens"] for o in valid)
    health = httpx.get(url + "/health", timeout=60).json()
    return {
        "clients": clients, "requests_per_client": requests, "max_tokens": tokens, "requests": len(outcomes),
        "answered": len(outcomes), "all_correct": all(o["ok"] for o in outcomes),
        "wrong": [o["kind"] for o in outcomes if not o["ok"]],
        "wall_s": round(wall_s, 2), "requests_per_s": round(len(outcomes) / wall_s, 3),
        "completion_tokens": generated, "tokens_per_s": round(generated / wall_s, 2),
        "latency_p50_s": round(_percentile(latencies, 50), 3), "latency_p95_s": round(_percentile(latencies, 95), 3),
        "server_alive": health["status"] == "ok",
    }


def _percentile(sorted_values: list[float], percent: float) -> float:
    """Nearest-rank percentile."""
    rank = max(1, round(percent / 100 * len(sorted_values) + 0.5 - 1e-9))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@contextmanager
def _server(args: argparse.Namespace) -> Any:
    if args.url:
        yield args.url.rstrip("/")
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "goose", "serve", "--model", args.model, "--dtype", args.dtype,
               "--threads", str(args.threads), "--port", str(port), "--log-level", "warning",
               "--max-queue", str(max(32, args.clients))]
    if args.max_batch is not None:
        command += ["--max-batch", str(args.max_batch)]
    process = subprocess.Popen(command, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None:
                raise SystemExit(f"goose serve exited with {process.returncode}")
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("goose serve did not come up in 600 s")
            time.sleep(0.5)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


if __name__ == "__main__":
    main()
