"""goose serve --max-batch 4 for real: concurrent requests decode together, each answer the one it gets alone.

One server process on 127.0.0.1 (float32, an API key) shared by the module; clients are the real
`openai` client and raw HTTP. References are the greedy (or seeded) autoregressive runs of this
process (the suite's ``ar_reference``), so "correct" means token-exact.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from goose.cycle.sampling import choice_seed
from goose.models import encode_chat
from tests.helpers import (
    API_KEY,
    AUTH,
    DEVICE,
    MODEL,
    PROMPT,
    SCHEMA,
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

pytestmark = pytest.mark.xdist_group("batch_server")  # one worker starts the module's server once

MAX_BATCH = 4
CACHE_TOKENS = MAX_BATCH * 1024  # --max-cache-tokens: each slot holds 1024 positions
BUDGET = 8  # a tree every cycle for every row, whatever curve this machine measured: the lossless checks need drafts


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("serve-batch") / "server.log"
    command = [sys.executable, "-m", "goose", "serve", "--model", MODEL, "--dtype", "float32", "--device", DEVICE,
               "--threads", os.environ.get("GOOSE_TEST_THREADS", "2"), "--port", str(port), "--api-key", API_KEY,
               "--max-batch", str(MAX_BATCH), "--max-queue", "16", "--max-cache-tokens", str(CACHE_TOKENS),
               "--budget", str(BUDGET)]
    running = start_server(command, port, log)
    yield running
    running.process.terminate()
    running.process.wait(timeout=60)


@pytest.fixture(scope="module")
def reference(smollm2, ar_reference) -> Reference:
    return Reference(*smollm2, ar_reference)


def batch_sizes(server: Server) -> tuple[float, float]:
    """(passes, passes with more than one request) from /metrics' goose_batch_size histogram."""
    samples = server.metrics()
    total = samples[("goose_batch_size_count", ())]
    alone = samples[("goose_batch_size_bucket", (("le", "1.0"),))]
    return total, total - alone


def test_8_clients_decode_together_and_every_answer_is_the_one_alone(server: Server, reference: Reference) -> None:
    """Streamed and not, chat (with log probabilities) and completions (n = 2), some malformed (a schema that does
    not compile among them): every valid answer exact, every bad one a 400."""
    server.wait_idle()
    prompts = ["Name three rivers.", "What is 2 + 2?", "Say hello in French.", "Write a haiku about autumn leaves.",
               "List the days of the week.", "Count from one to ten in words."]
    tokens = [24, 12, 16, 32, 24, 40]  # requests end at different cycles: rows leave while others decode
    expected_chat = {p: reference.chat([{"role": "user", "content": p}], n)[0] for p, n in zip(prompts, tokens,
                                                                                                strict=True)}
    expected_completion = {p: reference.completion(p, n)[0] for p, n in zip(prompts, tokens, strict=True)}
    limits = dict(zip(prompts, tokens, strict=True))
    bad_bodies = [{"messages": []}, {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
                  {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
                  {"messages": [{"role": "user", "content": "x"}],
                   "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}}]
    before_total, before_shared = batch_sizes(server)

    def one_client(index: int) -> tuple[list[tuple[str, bool]], list[tuple[dict[str, Any], str, str]]]:
        """(kind, passed) of the checks made here, and (goose statistics, text, the reference's) of every choice."""
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
        checks: list[tuple[str, bool]] = []
        answered: list[tuple[dict[str, Any], str, str]] = []
        for step in range(3):
            prompt = prompts[(index + step) % len(prompts)]
            kind = (index + step) % 4
            if kind == 0:  # with log probabilities: the same text, one entry per token
                answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                                        max_tokens=limits[prompt], logprobs=True, top_logprobs=2)
                choice = answer.choices[0]
                entries = choice.logprobs.content if choice.logprobs else []
                checks.append(("chat with logprobs", bool(entries) and all(entry.logprob <= 0 for entry in entries)))
                answered.append((answer.model_extra["goose"], choice.message.content, expected_chat[prompt]))
            elif kind == 1:
                text, chunks = stream_chat(client, model=MODEL, messages=[{"role": "user", "content": prompt}],
                                           max_tokens=limits[prompt])
                answered.append((chunks[-1].model_extra["goose"], text, expected_chat[prompt]))
            elif kind == 2:
                stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=limits[prompt], stream=True,
                                                   n=2)  # two greedy choices: each the one output
                texts = ["", ""]
                for chunk in stream:
                    for choice in chunk.choices:
                        texts[choice.index] += choice.text
                answered += zip(chunk.model_extra["goose_choices"], texts, [expected_completion[prompt]] * 2,
                                strict=True)  # the last chunk holds every choice's statistics
            else:
                response = server.post("/v1/chat/completions", bad_bodies[index % len(bad_bodies)])
                checks.append(("malformed", response.status_code == 400))
        return checks, answered

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one_client, range(8), timeout=600))
    checks = [check for per_client, _ in results for check in per_client]
    answered = [choice for _, per_client in results for choice in per_client]
    assert (len(checks), len(answered)) == (12, 24)
    assert all(ok for _, ok in checks), [kind for kind, ok in checks if not ok]
    # every choice's text and faults, the drafting of the 24 choices (18 requests) together
    stats, texts, references = (list(column) for column in zip(*answered, strict=True))
    assert_served_lossless(stats, texts, references, label="8 clients")
    total, shared = batch_sizes(server)
    assert shared - before_shared > 0 and total > before_total  # passes held several requests
    assert server.get("/health").json()["status"] == "ok"


def test_seeded_sampling_and_stop_strings_in_a_batch(server: Server, reference: Reference) -> None:
    """Each request keeps its own seed and its own stop strings while it shares passes with the others."""
    server.wait_idle()
    prompt = "Once upon a time"
    sampled = {seed: reference.generate(reference.ids(prompt), 24, temperature=0.8, seed=seed).text
               for seed in (1, 2, 3)}
    greedy = reference.completion(prompt, 32)[0]
    stop = greedy.split()[3]  # a word the greedy text reaches: it stops there
    answers: dict[str, dict[str, Any]] = {}

    def ask(name: str, body: dict) -> None:
        response = server.post("/v1/completions", {"prompt": prompt, **body})
        assert response.status_code == 200, response.text
        answers[name] = response.json()

    threads = [threading.Thread(target=ask, args=(f"seed {seed}", {"max_tokens": 24, "temperature": 0.8,
                                                                   "seed": seed})) for seed in (1, 2, 3)]
    threads.append(threading.Thread(target=ask, args=("stop", {"max_tokens": 32, "stop": [stop]})))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    names = [f"seed {seed}" for seed in (1, 2, 3)] + ["stop"]
    assert_served_lossless([answers[name]["goose"] for name in names],
                           [answers[name]["choices"][0]["text"] for name in names],
                           [sampled[1], sampled[2], sampled[3], greedy[: greedy.index(stop)]])
    assert answers["stop"]["choices"][0]["finish_reason"] == "stop"


def test_a_client_leaving_mid_batch_changes_no_other_answer(server: Server, reference: Reference) -> None:
    server.wait_idle()
    expected = reference.completion("The capital of France is", 32)[0]
    kept: dict[str, Any] = {}

    def steady() -> None:
        kept["answer"] = server.post("/v1/completions", {"prompt": "The capital of France is",
                                                         "max_tokens": 32}).json()

    body = {"prompt": "Tell me a long story", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH, timeout=120) as leaving:
        lines = leaving.iter_lines()
        next(lines)
        other = threading.Thread(target=steady)
        other.start()
        for _, _line in zip(range(4), lines, strict=False):
            pass
    other.join(timeout=300)
    assert_served_lossless(kept["answer"], kept["answer"]["choices"][0]["text"], expected, label="beside")
    server.wait_idle()
    after = server.post("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 32})
    assert after.status_code == 200, after.text
    assert_served_lossless(after.json(), after.json()["choices"][0]["text"], expected, label="after")
    # a request that could outgrow its slot's share of --max-cache-tokens is a 400; the server carries on
    beyond = server.post("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 1024})
    error = beyond.json()["error"]
    assert beyond.status_code == 400 and error["code"] == "context_length_exceeded", beyond.text
    assert "cache budget" in error["message"] and "1024 positions" in error["message"]
    assert server.post("/v1/completions", {"prompt": "The capital of France is",
                                           "max_tokens": 32}).json()["choices"][0]["text"] == expected


def test_n_choices_decode_together_each_with_its_own_seed(server: Server, reference: Reference) -> None:
    """``n``: sampled, choice i is the seeded autoregressive run with ``choice_seed(seed, i)`` (choice 0: the
    request's seed), streamed or not; greedy, every choice is the one output; usage counts every choice."""
    server.wait_idle()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "Write a sentence about the sea."}]
    ids = encode_chat(reference.tokenizer, messages)
    sampled = [reference.generate(ids, 16, temperature=0.8, seed=choice_seed(7, i)).text for i in range(3)]
    answer = client.chat.completions.create(model=MODEL, messages=messages, n=3, max_tokens=16, temperature=0.8,
                                            seed=7)
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    assert_served_lossless(answer, [choice.message.content for choice in answer.choices], sampled, label="chat")
    assert len(set(sampled)) > 1  # the choices differ: each draws with its own seed
    extra = answer.model_extra or {}
    assert [stats["seed"] for stats in extra["goose_choices"]] == [choice_seed(7, i) for i in range(3)]
    assert answer.usage.completion_tokens == sum(stats["new_tokens"] for stats in extra["goose_choices"])
    # streamed: every chunk names its choice; the choices' texts come out whole
    texts, finished = ["", ""], [None, None]
    for chunk in client.completions.create(model=MODEL, prompt="The sea is", n=2, max_tokens=12, temperature=0.8,
                                           seed=7, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            finished[choice.index] = choice.finish_reason or finished[choice.index]
    prompt_ids = reference.ids("The sea is")
    assert_served_lossless(chunk, texts, [reference.generate(prompt_ids, 12, temperature=0.8, seed=choice_seed(7, i))
                                          for i in range(2)], label="streamed")
    assert None not in finished
    greedy = client.completions.create(model=MODEL, prompt="The sea is", n=2, max_tokens=12)
    assert_served_lossless(greedy, [choice.text for choice in greedy.choices],
                           [reference.completion("The sea is", 12)[0]] * 2, label="greedy")




def test_response_format_json_schema_through_the_openai_client(server: Server, reference: Reference) -> None:
    """Structured outputs on the batched engine: the schema's JSON, token for token constrained greedy decoding,
    the drafts the grammar forbids counted; a schema that cannot compile is a 400 naming response_format."""
    server.wait_idle()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
    messages = [{"role": "user", "content": PROMPT}]
    expected = reference.generate(encode_chat(reference.tokenizer, messages), 48, json_schema=SCHEMA)
    response = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=48,
        response_format={"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}})
    content = response.choices[0].message.content
    assert_served_lossless(response, content, expected)
    assert response.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(content), SCHEMA)
    assert response.model_extra["goose"]["grammar_cut_tokens"] > 0
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object", "properties": {
                "a": {"type": "string", "pattern": "(("}}}}})
    assert raised.value.body["param"] == "response_format" and "unclosed group" in raised.value.body["message"]


def test_logprobs_in_a_batch_end_where_a_stop_string_cuts_the_text(server: Server, reference: Reference) -> None:
    """The batched engine (goose serve's default): a streamed completion cut by a stop string carries the log
    probabilities of the tokens whose text it sent, each the autoregressive loop's, beside another request."""
    server.wait_idle()
    model, tokenizer = reference.model, reference.tokenizer
    prompt = "Once upon a time"
    expected = ar_logprobs(model, tokenizer, reference.ids(prompt), 16, 2)
    stop = expected.text.split()[4]
    cut = expected.text.index(stop)
    starts = [len(tokenizer.decode(expected.new_token_ids[:i])) for i in range(len(expected.new_token_ids))]
    kept = sum(1 for start in starts if start < cut)  # the tokens whose text begins before the stop string
    other = threading.Thread(target=server.post, args=("/v1/completions", {"prompt": "The capital of France is",
                                                                            "max_tokens": 12}))
    other.start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, logprobs=2, stop=[stop],
                                            stream=True))
    other.join(timeout=300)
    pieces = [c.choices[0] for c in chunks if c.choices and c.choices[0].logprobs is not None]
    # three passes before the stop string: drafted and tested, not necessarily kept
    assert_served_lossless(chunks[-1], "".join(piece.text for piece in pieces), expected.text[:cut], accepted=False)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    got = [row for piece in pieces for row in completion_rows(piece.logprobs, 2)]
    assert_same_logprobs(got, rows(expected.logprobs[:kept], tokenizer))
    tokens = [token for piece in pieces for token in piece.logprobs.tokens]
    assert "".join(tokens).startswith(expected.text[:cut]) and len("".join(tokens[:-1])) < cut
