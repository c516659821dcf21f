"""vLLM's OpenAI server with the Goose proposer answers a chat request with the text vLLM gives without speculation.

The text without speculation comes from the session's offline engine (``LLM.chat``: the same chat
template and greedy decoding the server applies), so the suite starts one server, not two.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai
import pytest

from tests.vllm.conftest import MAX_MODEL_LEN, MAX_NUM_SEQS, MAX_TOKENS, QUESTIONS, goose_speculation

SERVED_NAME = "smollm2"
START_TIMEOUT_S = 300.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def openai_server(model_path: str, speculative_config: dict | None) -> Iterator[openai.OpenAI]:
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1, and a client for it; stopped after."""
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
               "--enforce-eager", "--seed", "0"]
    if speculative_config is not None:
        command += ["--speculative-config", json.dumps(speculative_config)]
    with tempfile.TemporaryFile(mode="w+") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        try:
            _wait_until_healthy(server, port, log)
            yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120.0)
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _wait_until_healthy(server: subprocess.Popen, port: int, log) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            log.seek(0)
            pytest.fail(f"vLLM server exited with status {server.returncode}:\n{log.read()[-4000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    log.seek(0)
    pytest.fail(f"vLLM server not healthy after {START_TIMEOUT_S:.0f} s:\n{log.read()[-4000:]}")


def chat_answers(client: openai.OpenAI) -> list[str]:
    answers = []
    for question in QUESTIONS:
        reply = client.chat.completions.create(model=SERVED_NAME, messages=[{"role": "user", "content": question}],
                                               temperature=0.0, max_tokens=MAX_TOKENS)
        answers.append(reply.choices[0].message.content)
    return answers


def test_chat_through_the_server_equals_no_speculation(model_path, chat_reference):
    expected = chat_reference
    with openai_server(model_path, goose_speculation()) as client:
        answers = chat_answers(client)
        metrics = httpx.get(str(client.base_url).removesuffix("/v1/") + "/metrics", timeout=10.0).text
    assert all(answer.strip() for answer in expected)
    assert answers == expected
    accepted = [line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_accepted_tokens_total")]
    assert accepted and float(accepted[0].split()[-1]) > 0, "the Goose proposer's drafts were never accepted"
