"""goose serve for real: one server process on 127.0.0.1, called with the `openai` client and raw HTTP.

The server is started once for the module (`python -m goose serve`, float32, an API key, a small
queue) and shared; every generation asks for few tokens. References come from the autoregressive
loop in this process and from `goose generate`, so "correct" means token-exact greedy decoding.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from goose import cli
from goose.models import encode_chat
from goose.serve.stop import StopScanner
from tests.helpers import (
    API_KEY,
    AUTH,
    DEVICE,
    MODEL,
    REPO,
    Row,
    Server,
    ar_logprobs,
    assert_same_logprobs,
    assert_served_lossless,
    completion_rows,
    free_port,
    rows,
    start_server,
    stream_chat,
)
from tests.helpers import ServerReference as Reference

pytestmark = pytest.mark.xdist_group("server")  # one worker: the module's server (a model load) starts once

MAX_QUEUE = 8  # the load test's 8 clients never fill it (1 runs, 7 wait); the 503 test fills it on purpose
# A tree every cycle: the lossless checks need drafts laid and tested, whatever cost curve this machine measured (an
# automatic budget on a curve where a second row costs half a pass lays none in a fresh server's first requests)
BUDGET = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    command = [sys.executable, "-m", "goose", "serve", "--model", MODEL, "--dtype", "float32", "--device", DEVICE,
               "--threads", os.environ.get("GOOSE_TEST_THREADS", "2"), "--port", str(port), "--api-key", API_KEY,
               "--max-queue", str(MAX_QUEUE), "--max-batch", "1",  # one at a time: the queue's tests need it
               "--budget", str(BUDGET)]
    running = start_server(command, port, log)
    yield running
    _stop_with_a_generation_in_flight(running)


def _stop_with_a_generation_in_flight(server: Server) -> None:
    """Ctrl-C while a stream runs and a request waits: both hear 503 at once and the server exits cleanly."""
    ended: dict[str, Any] = {}

    def waiting() -> None:
        ended["waiting"] = server.post("/v1/completions", {"prompt": "Once", "max_tokens": 500, "ignore_eos": True})

    body = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH, timeout=120) as streamed:
        lines = streamed.iter_lines()
        next(lines)
        second = threading.Thread(target=waiting)
        second.start()
        while server.get("/health").json()["waiting"] < 1:
            time.sleep(0.02)
        server.process.send_signal(signal.SIGINT)
        rest = [line for line in lines if line]
    second.join(timeout=60)
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        pytest.fail("goose serve did not shut down within 30 s of SIGINT")
    assert server.process.returncode == 0, server.log.read_text()[-3000:]
    assert rest[-1] == "data: [DONE]" and "shutting_down" in "".join(rest)  # the stream ends in-band
    assert ended["waiting"].status_code == 503 and ended["waiting"].json()["error"]["code"] == "shutting_down"


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(smollm2, ar_reference) -> Reference:
    return Reference(*smollm2, ar_reference)


def _goose(response: Any) -> dict[str, Any]:
    stats = (response.model_extra or {}).get("goose")
    assert isinstance(stats, dict), f"no goose statistics in {response}"
    return stats


def _assert_stats(stats: dict[str, Any], completion_tokens: int) -> None:
    assert stats["new_tokens"] == completion_tokens
    # tau is what the passes gave per pass: every token but the first (the prefill's) came from a verify pass
    assert stats["verify_steps"] >= 1
    assert stats["tau"] == pytest.approx((stats["new_tokens"] - 1) / stats["verify_steps"], abs=1e-4)
    assert all(0 <= stats["source_accepted"].get(name, 0) <= tested for name, tested in stats["source_tested"].items())
    assert stats["tokens_per_s"] > 0 and stats["queue_s"] >= 0
    assert set(stats["source_acceptance"]) <= set(stats["sources"])
    assert all(0.0 <= rate <= 1.0 for rate in stats["source_acceptance"].values())


# --- routes -------------------------------------------------------------------------------------


def test_models_health_and_metrics_routes(server: Server, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    health = server.get("/health")  # open without the key, like /metrics
    assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["model"] == MODEL
    metrics = server.get("/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families(metrics.text)}
    assert {"goose_http_requests", "goose_generations", "goose_completion_tokens", "goose_verify_steps",
            "goose_request_tau", "goose_source_acceptance_ratio", "goose_queue_depth"} <= names


# --- output: exactly greedy decoding --------------------------------------------------------------


def test_chat_equals_goose_generate(client: openai.OpenAI) -> None:
    """The contract: a temperature-0 chat request's content is `goose generate PROMPT`'s text."""
    prompt = "Write a haiku about geese."
    response = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                              temperature=0, max_tokens=32)
    generated = subprocess.run(
        [sys.executable, "-m", "goose", "generate", prompt, "--dtype", "float32", "--device", DEVICE,
         "--max-new-tokens", "32", "--threads", os.environ.get("GOOSE_TEST_THREADS", "2")],
        capture_output=True, text=True, timeout=600, cwd=REPO, check=True)
    assert response.choices[0].message.content + "\n" == generated.stdout
    assert_served_lossless(response, response.choices[0].message.content, generated.stdout[:-1])
    assert response.choices[0].message.role == "assistant"
    assert response.usage.prompt_tokens > 0 and 0 < response.usage.completion_tokens <= 32
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens
    _assert_stats(_goose(response), response.usage.completion_tokens)


def test_chat_float32_greedy_equals_autoregressive_streamed_and_not(client: openai.OpenAI,
                                                                    reference: Reference) -> None:
    messages = [{"role": "system", "content": "You answer in one short paragraph."},
                {"role": "user", "content": "Why do geese fly in a V formation?"}]
    text, tokens, finish = reference.chat(messages, 24)
    whole = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=24)
    assert_served_lossless(whole, whole.choices[0].message.content, text)
    assert whole.usage.completion_tokens == tokens and whole.choices[0].finish_reason == finish
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")

    streamed, chunks = stream_chat(client, model=MODEL, messages=messages, temperature=0, max_tokens=24)
    assert_served_lossless(chunks[-1], streamed, text)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [finish]
    last = chunks[-1]  # usage and the Goose statistics ride the last chunk, which has no choices
    assert last.choices == [] and last.usage.completion_tokens == tokens
    _assert_stats(_goose(last), tokens)
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_float32_greedy_equals_autoregressive_streamed_and_not(client: openai.OpenAI,
                                                                          reference: Reference) -> None:
    prompt = "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n"
    text, tokens, finish = reference.completion(prompt, 24)
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    assert_served_lossless(whole, whole.choices[0].text, text)
    assert whole.usage.completion_tokens == tokens
    assert whole.choices[0].finish_reason == finish and whole.object == "text_completion"
    _assert_stats(_goose(whole), tokens)

    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, stream=True))
    assert_served_lossless(chunks[-1], "".join(c.choices[0].text for c in chunks if c.choices), text)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == tokens
    _assert_stats(_goose(chunks[-1]), tokens)

    by_ids = client.completions.create(model=MODEL, prompt=reference.ids(prompt), max_tokens=24)
    assert_served_lossless(by_ids, by_ids.choices[0].text, text)  # a prompt of token ids is the same prompt


def test_goose_options_per_request_change_speed_not_output(client: openai.OpenAI, reference: Reference) -> None:
    messages = [{"role": "user", "content": "List the days of the week, then list them again."}]
    text = reference.chat(messages, 32)[0]
    default = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32)
    chain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32,
                                           extra_body={"sources": ["context_match"], "topology": "chain",
                                                       "budget": 4})
    for answer, label in ((default, "default"), (chain, "chain")):  # lossless either way
        assert_served_lossless(answer, answer.choices[0].message.content, text, label=label)
    stats = _goose(chain)
    assert stats["sources"] == ["context_match"] and stats["topology"] == "chain" and stats["budget"] == 4
    assert set(stats["source_acceptance"]) <= {"context_match"}
    assert _goose(default)["sources"] == ["context_match", "bigram_transition"]


# --- Predicted Outputs ----------------------------------------------------------------------------


def _prediction_counts(usage: Any) -> tuple[int, int]:
    details = usage.completion_tokens_details
    return details.accepted_prediction_tokens, details.rejected_prediction_tokens


def test_predicted_outputs_through_the_openai_client(client: openai.OpenAI, reference: Reference) -> None:
    """The openai client's prediction= drafts from the text, the answer is unchanged, and the counters add up."""
    messages = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]
    text, tokens, _ = reference.chat(messages, 32)
    plain = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=32)
    assert_served_lossless(plain, plain.choices[0].message.content, text, label="no prediction")
    assert _prediction_counts(plain.usage) == (0, 0)
    edited = text.replace("square", "cube", 1)  # a prediction that departs and comes back
    for label, predicted in (("the output", text), ("edited", edited), ("unrelated", "Geese migrate south in autumn.")):
        answer = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=32,
                                                prediction={"type": "content", "content": predicted})
        assert_served_lossless(answer, answer.choices[0].message.content, text, label=label)
        accepted, rejected = _prediction_counts(answer.usage)
        stats = _goose(answer)
        assert stats["sources"][0] == "prediction"
        assert accepted == stats["source_accepted"].get("prediction", 0)
        assert accepted + rejected == stats["source_tested"].get("prediction", 0)
        if predicted == text:
            assert accepted >= tokens // 2 and stats["tau"] > _goose(plain)["tau"]
    streamed, chunks = stream_chat(client, model=MODEL, messages=messages, temperature=0, max_tokens=32,
                                    prediction={"type": "content", "content": [{"type": "text", "text": text}]},
                                    stream_options={"include_usage": True})
    assert_served_lossless(chunks[-1], streamed, text, label="streamed")
    assert _prediction_counts(chunks[-1].usage)[0] >= tokens // 2

    prompt = "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n"
    completion_text, _, _ = reference.completion(prompt, 24)
    completion = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24,
                                           extra_body={"prediction": {"type": "content", "content": completion_text}})
    assert_served_lossless(completion, completion.choices[0].text, completion_text, label="completion")
    assert _prediction_counts(completion.usage)[0] > 0


# --- stop sequences -----------------------------------------------------------------------------


def test_stop_sequences_cut_the_output_streamed_and_not(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40)
    text = full.choices[0].message.content
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # three characters from the middle: likely split over tokens
    expected = text[: text.index(stop)]
    cut = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, stop=[stop, "never-there"])
    assert cut.choices[0].message.content == expected and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < full.usage.completion_tokens  # the generation ended there
    streamed, chunks = stream_chat(client, model=MODEL, messages=messages, max_tokens=40, stop=stop)
    assert streamed == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    completion = client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5,", max_tokens=16, stop=", 9")
    assert ", 9" not in completion.choices[0].text and completion.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("pieces", [["ab", "cSTOPd"], ["abS", "TO", "Pcd"], list("abSTOPcd"), ["abST", "x"]])
def test_stop_scanner_catches_stops_split_across_chunks(pieces: list[str]) -> None:
    scanner = StopScanner(("STOP", "zz"))
    sent = "".join(scanner.feed(piece) for piece in pieces)
    joined = "".join(pieces)
    if "STOP" in joined:
        assert scanner.stopped and sent == joined[: joined.index("STOP")]
    else:  # "abST" was held back as a possible stop until "x" decided it
        assert not scanner.stopped and sent + scanner.flush() == joined


# --- sampling parameters --------------------------------------------------------------------------


def test_sampled_requests_replay_by_seed_and_equal_the_seeded_sampler(client: openai.OpenAI,
                                                                         reference: Reference) -> None:
    messages = [{"role": "user", "content": "Name three birds and say one thing about each."}]
    options = {"temperature": 0.8, "top_p": 0.9, "seed": 7}
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, **options)
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, **options)
    assert first.choices[0].message.content == again.choices[0].message.content
    assert _goose(first)["seed"] == 7
    # float32: the server's sampled text is the seeded autoregressive sampler's
    ids = encode_chat(reference.tokenizer, messages)
    expected = reference.generate(ids, 24, **options)
    assert_served_lossless(first, first.choices[0].message.content, expected)
    streamed, chunks = stream_chat(client, model=MODEL, messages=messages, max_tokens=24, **options)
    assert_served_lossless(chunks[-1], streamed, expected)


# --- log probabilities ----------------------------------------------------------------------------


def chat_rows(content: list[Any]) -> list[Row]:
    """A chat response's logprobs.content as rows (token text, logprob, top alternatives)."""
    return [(e.token, e.logprob, tuple((t.token, t.logprob) for t in e.top_logprobs)) for e in content]


def test_logprobs_chat_and_completions_equal_the_python_reference(client: openai.OpenAI, reference: Reference) -> None:
    """Chat and completions, streamed and not, greedy and seeded: each equals the autoregressive loop's within 1e-4,
    and every streamed chunk carries the tokens whose text it carries."""
    model, tokenizer = reference.model, reference.tokenizer
    messages = [{"role": "user", "content": "Why do geese fly in a V formation?"}]
    chat_ids = encode_chat(tokenizer, messages)
    greedy = ar_logprobs(model, tokenizer, chat_ids, 16, 3)
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, logprobs=True,
                                           top_logprobs=3)
    content = whole.choices[0].logprobs.content
    kept = assert_served_lossless(whole, whole.choices[0].message.content, greedy, accepted=False)[1]
    assert_same_logprobs(chat_rows(content), rows(greedy.logprobs, tokenizer))
    assert "".join(e.token for e in content) == whole.choices[0].message.content
    assert all(bytes(e.bytes) == e.token.encode() for e in content)

    sampling = {"temperature": 0.8, "seed": 5}
    sampled = ar_logprobs(model, tokenizer, chat_ids, 16, 0, **sampling)
    text, chunks = stream_chat(client, model=MODEL, messages=messages, max_tokens=16, logprobs=True, **sampling)
    kept += assert_served_lossless(chunks[-1], text, sampled, accepted=False)[1]
    carrying = [c.choices[0] for c in chunks if c.choices and c.choices[0].logprobs is not None]
    for choice in carrying:  # a chunk's log probabilities are those of the tokens whose text it carries
        assert "".join(e.token for e in choice.logprobs.content) == choice.delta.content
    assert_same_logprobs(chat_rows([e for c in carrying for e in c.logprobs.content]),
                         rows(sampled.logprobs, tokenizer))

    prompt = "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n"
    prompt_ids = reference.ids(prompt)
    greedy = ar_logprobs(model, tokenizer, prompt_ids, 16, 2)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, logprobs=2, stream=True))
    pieces = [c.choices[0] for c in chunks if c.choices and c.choices[0].logprobs is not None]
    assert all("".join(piece.logprobs.tokens) == piece.text for piece in pieces)
    streamed = [row for piece in pieces for row in completion_rows(piece.logprobs, 2)]
    assert_same_logprobs(streamed, rows(greedy.logprobs, tokenizer))
    offsets = [offset for piece in pieces for offset in piece.logprobs.text_offset]
    text = "".join(piece.text for piece in pieces)
    assert offsets == [len(tokenizer.decode(greedy.new_token_ids[:i])) for i in range(len(offsets))]
    kept += assert_served_lossless(chunks[-1], text, greedy, accepted=False)[1]

    sampled = ar_logprobs(model, tokenizer, prompt_ids, 16, 5, **sampling)
    completion = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, logprobs=5, **sampling)
    kept += assert_served_lossless(completion, completion.choices[0].text, sampled, accepted=False)[1]
    assert kept > 0  # 16 tokens a request: the target kept drafts over the four together
    assert_same_logprobs(completion_rows(completion.choices[0].logprobs, 5), rows(sampled.logprobs, tokenizer))
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert plain.choices[0].logprobs is None  # none unless asked for


# --- errors -------------------------------------------------------------------------------------

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
LONG = "goose " * 9000  # SmolLM2's context is 8192 tokens

BAD_CHAT: list[tuple[Any, str | None]] = [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type"),
    ({**CHAT, "messages": [{"role": "user", "content": LONG}]}, "messages"),
    ({**CHAT, "max_tokens": 0}, "max_tokens"),
    ({**CHAT, "max_tokens": -5}, "max_tokens"),
    ({**CHAT, "max_tokens": "5"}, "max_tokens"),
    ({**CHAT, "max_tokens": 2.5}, "max_tokens"),
    ({**CHAT, "max_tokens": 10**6}, "max_tokens"),
    ({**CHAT, "max_completion_tokens": 10**6}, "max_completion_tokens"),
    ({**CHAT, "temperature": -1}, "temperature"),
    ({**CHAT, "temperature": "hot"}, "temperature"),
    ({**CHAT, "top_p": 0}, "top_p"),
    ({**CHAT, "seed": -1}, "seed"),
    ({**CHAT, "stop": ""}, "stop"),
    ({**CHAT, "stop": 5}, "stop"),
    ({**CHAT, "stream": "yes"}, "stream"),
    ({**CHAT, "n": 0}, "n"),
    ({**CHAT, "n": 17}, "n"),
    ({**CHAT, "n": True}, "n"),
    ({**CHAT, "logprobs": "yes"}, "logprobs"),
    ({**CHAT, "logprobs": 1}, "logprobs"),
    ({**CHAT, "top_logprobs": 3}, "top_logprobs"),  # OpenAI: top_logprobs needs logprobs true
    ({**CHAT, "logprobs": False, "top_logprobs": 3}, "top_logprobs"),
    ({**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({**CHAT, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({**CHAT, "presence_penalty": 0.5}, "presence_penalty"),
    ({**CHAT, "response_format": {"type": "xml"}}, "response_format"),
    ({**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wibble"}}}},
     "response_format"),  # a schema the grammar library cannot compile
    ({**CHAT, "response_format": {"type": "json_object"}, "ignore_eos": True}, "response_format"),
    ({**CHAT, "sources": ["nope"]}, "sources"),
    ({**CHAT, "sources": []}, "sources"),
    ({**CHAT, "topology": "nope"}, "topology"),
    ({**CHAT, "budget": 0}, "budget"),
    ({**CHAT, "budget": "big"}, "budget"),
    ({**CHAT, "wibble": 1}, "wibble"),
    ({**CHAT, "prediction": "def f(): pass"}, "prediction"),
    ({**CHAT, "prediction": {"type": "content", "content": ""}}, "prediction.content"),
    ({**CHAT, "prediction": {"type": "content", "content": []}}, "prediction.content"),
    ({**CHAT, "prediction": {"type": "content", "content": [{"type": "text", "text": ""}]}}, "prediction.content"),
    ({**CHAT, "prediction": {"type": "content", "content": 5}}, "prediction.content"),
    ({**CHAT, "prediction": {"type": "text", "content": "x"}}, "prediction.type"),
    ({**CHAT, "prediction": {"type": "content", "content": LONG}}, "prediction"),
    ([CHAT], None),
    ("hi", None),
]
BAD_COMPLETION: list[tuple[Any, str | None]] = [
    ({"max_tokens": 2}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, 10**9]}, "prompt"),
    ({"prompt": LONG}, "prompt"),
    ({"prompt": "hi", "echo": True}, "echo"),
    ({"prompt": "hi", "best_of": 3}, "best_of"),
    ({"prompt": "hi", "suffix": "x"}, "suffix"),
    ({"prompt": "hi", "logprobs": 6}, "logprobs"),
    ({"prompt": "hi", "logprobs": -1}, "logprobs"),
    ({"prompt": "hi", "logprobs": True}, "logprobs"),
    ({"prompt": "hi", "top_logprobs": 2}, "top_logprobs"),  # the chat endpoint's field
    ({"prompt": "hi", "prediction": {"content": "x"}}, "prediction.type"),
    ({"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format.json_schema.json_schema.name"),
    ({"prompt": "hi", "prediction": {"type": "content", "content": LONG}}, "prediction"),
]


@pytest.mark.parametrize(("body", "param"), BAD_CHAT)
def test_bad_chat_requests_are_400_naming_the_field(server: Server, body: Any, param: str | None) -> None:
    _assert_400(server.post("/v1/chat/completions", body), param)


@pytest.mark.parametrize(("body", "param"), BAD_COMPLETION)
def test_bad_completion_requests_are_400_naming_the_field(server: Server, body: Any, param: str | None) -> None:
    _assert_400(server.post("/v1/completions", body), param)


def _assert_400(response: httpx.Response, param: str | None) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param, error


def test_malformed_bodies_and_routes(server: Server) -> None:
    bad_json = server.post("/v1/chat/completions", None, raw=b'{"messages": [')
    _assert_400(bad_json, None)
    assert bad_json.json()["error"]["code"] == "invalid_json"
    _assert_400(server.post("/v1/completions", None, raw=b"\xff\xfe\x00"), None)
    no_content_type = httpx.post(server.url + "/v1/chat/completions", content=json.dumps(CHAT), headers=AUTH,
                                 timeout=60)
    assert no_content_type.status_code == 415  # JSON content type required (tests/test_serve_hardening.py)
    too_big = server.post("/v1/completions", None, raw=b'{"prompt": "' + b"x" * (5 << 20) + b'"}')
    assert too_big.status_code == 413 and too_big.json()["error"]["message"]
    missing = server.get("/v1/nothing")
    assert missing.status_code == 404 and "error" in missing.json()
    wrong_method = server.get("/v1/chat/completions", headers=AUTH)
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def test_client_errors_through_the_openai_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=4)
    assert empty.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as two:
        client.chat.completions.create(model=MODEL, messages=CHAT["messages"], n=17)
    assert two.value.body["param"] == "n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.dictionaries(st.sampled_from(["messages", "prompt", "stop", "temperature", "stream", "sources",
                                             "budget", "n", "model", "seed", "top_p", "x"]),
                            st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                                         lambda inner: st.lists(inner, max_size=3)
                                         | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                                         max_leaves=6), max_size=5),
       route=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_no_input_takes_the_server_down(server: Server, body: dict[str, Any], route: str) -> None:
    body["max_tokens"] = 1  # the rare valid body stays cheap
    response = server.post(route, None, raw=json.dumps(body, allow_nan=True).encode())
    assert response.status_code in (200, 400), response.text
    if response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.endswith("data: [DONE]\n\n")
    else:
        assert "error" in response.json() if response.status_code == 400 else response.json()["choices"]


# --- authentication -----------------------------------------------------------------------------


def test_api_key_is_required_on_v1(server: Server) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = httpx.post(server.url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=60)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server.url + "/v1/models", timeout=60).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()


# --- the queue, disconnects, load -----------------------------------------------------------------


def _cancelled(server: Server) -> float:
    return sum(v for (name, labels), v in server.metrics().items()
               if name == "goose_generations_total" and ("finish_reason", "cancelled") in labels)


def test_full_queue_answers_503_with_retry_after_and_serves_in_arrival_order(server: Server) -> None:
    server.wait_idle()
    long_request = {"messages": [{"role": "user", "content": "Tell a long story about a goose."}],
                    "max_tokens": 2000, "ignore_eos": True, "stream": True}
    finished: list[int] = []
    answers: dict[int, httpx.Response] = {}

    def queued(index: int) -> None:
        answers[index] = server.post("/v1/completions", {"prompt": f"Item {index}:", "max_tokens": 1})
        finished.append(index)

    with httpx.stream("POST", server.url + "/v1/chat/completions", json=long_request, headers=AUTH,
                      timeout=120) as busy:
        assert busy.status_code == 200
        lines = busy.iter_lines()  # kept: a dropped iterator would close the stream
        next(lines)  # the model is now generating this one
        threads = []
        for index in range(MAX_QUEUE):  # one at a time, so that arrival order is known
            thread = threading.Thread(target=queued, args=(index,))
            thread.start()
            threads.append(thread)
            deadline = time.monotonic() + 30
            while server.get("/health").json()["waiting"] < index + 1:
                assert time.monotonic() < deadline, "a request never reached the queue"
                time.sleep(0.02)
        refused = server.post("/v1/completions", {"prompt": "one too many", "max_tokens": 1})
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "queue_full"
    # leaving the stream disconnects it: the long generation stops and the queue drains
    for thread in threads:
        thread.join(timeout=120)
    assert all(answers[i].status_code == 200 for i in range(MAX_QUEUE)), [a.text for a in answers.values()]
    assert all(answers[i].json()["usage"]["completion_tokens"] == 1 for i in range(MAX_QUEUE))
    assert finished == list(range(MAX_QUEUE))  # first come, first served


def test_disconnect_frees_the_model(server: Server) -> None:
    server.wait_idle()
    before, tokens_before = _cancelled(server), server.metrics()[("goose_completion_tokens_total", ())]
    request = {"messages": [{"role": "user", "content": "Write a long essay about migrating birds."}],
               "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=request, headers=AUTH, timeout=120) as r:
        lines = r.iter_lines()
        received = [line for _, line in zip(range(6), lines, strict=False)]
    assert any(line.startswith("data: ") for line in received)
    # a non-streamed request whose client gives up while it generates
    with pytest.raises(httpx.ReadTimeout):
        server.post("/v1/chat/completions", {**request, "stream": False}, timeout=2.0)
    server.wait_idle()
    assert _cancelled(server) == before + 2
    generated = server.metrics()[("goose_completion_tokens_total", ())] - tokens_before
    assert generated < 2 * 1000  # both stopped early
    after = server.post("/v1/chat/completions", CHAT)
    assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"]


def test_load_8_clients_x_4_requests_mixed(server: Server, reference: Reference) -> None:
    """Concurrent clients, streamed and not, some malformed: every answer right, every bad one a 400, none lost."""
    server.wait_idle()
    prompts = ["Name three rivers.", "What is 2 + 2?", "Say hello in French.", "Name a colour."]
    expected_chat = {p: reference.chat([{"role": "user", "content": p}], 8)[0] for p in prompts}
    expected_completion = {p: reference.completion(p, 8)[0] for p in prompts}
    bad_bodies = [{"messages": []}, {"messages": [{"role": "user", "content": "x"}], "n": 0},
                  {"messages": [{"role": "user", "content": "x"}], "max_tokens": "eight"}]
    generations_before = sum(v for (name, _), v in server.metrics().items() if name == "goose_generations_total")

    def one_client(index: int) -> tuple[list[int], list[tuple[dict[str, Any], str, str]]]:
        """The malformed bodies' status codes, and (goose statistics, text, the reference's) of every answer."""
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
        statuses: list[int] = []
        answered: list[tuple[dict[str, Any], str, str]] = []
        for step in range(4):
            prompt = prompts[(index + step) % len(prompts)]
            kind = (index + step) % 4
            if kind == 0:
                answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                                        max_tokens=8)
                answered.append((_goose(answer), answer.choices[0].message.content, expected_chat[prompt]))
            elif kind == 1:
                text, chunks = stream_chat(client, model=MODEL, messages=[{"role": "user", "content": prompt}],
                                           max_tokens=8)
                answered.append((_goose(chunks[-1]), text, expected_chat[prompt]))
            elif kind == 2:
                if step % 2 == 0:
                    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, stream=True))
                    text, last = "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1]
                else:
                    last = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8)
                    text = last.choices[0].text
                answered.append((_goose(last), text, expected_completion[prompt]))
            else:
                statuses.append(server.post("/v1/chat/completions", bad_bodies[index % len(bad_bodies)]).status_code)
        return statuses, answered

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one_client, range(8), timeout=600))
    statuses = [status for per_client, _ in results for status in per_client]
    answered = [answer for _, per_client in results for answer in per_client]
    assert len(statuses) + len(answered) == 32 and set(statuses) == {400}
    # every answer's text and faults, the drafting of the 24 answers (8 tokens each) together
    stats, texts, references = (list(column) for column in zip(*answered, strict=True))
    assert_served_lossless(stats, texts, references, label="8 clients")
    generations = sum(v for (name, _), v in server.metrics().items() if name == "goose_generations_total")
    assert generations - generations_before == len(answered)  # none lost
    assert server.get("/health").json()["status"] == "ok"


@pytest.mark.parametrize(("flags", "message"), [(["--port", "70000"], "--port"), (["--max-queue", "0"], "--max-queue"),
                                                (["--topology", "nope"], "unknown topology"),
                                                (["--api-key", " "], "--api-key")])
def test_serve_cli_rejects_bad_flags(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", *flags]) == 2  # refused before any model is loaded
    err = capsys.readouterr().err.strip()
    assert err.startswith("goose: error:") and message in err and "\n" not in err
