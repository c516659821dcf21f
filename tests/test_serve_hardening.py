"""goose serve under attack: web pages, DNS rebinding, half-sent and slow requests, signals, big bodies.

One keyless server for the module (`python -m goose serve` on 127.0.0.1, float32, short body and
header deadlines, one allowed CORS origin), driven with httpx and raw sockets; the last test stops
it with SIGTERM. Generations ask for a few tokens only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
from starlette.testclient import TestClient

from goose import cli
from goose.serve.app import create_app
from goose.serve.guard import HostRule
from goose.serve.metrics import ServerMetrics
from tests.helpers import DEVICE, MODEL, Server, free_port, start_server

pytestmark = pytest.mark.xdist_group("server")

BODY_TIMEOUT_S = 1.5
HEADER_TIMEOUT_S = 2.0
ALLOWED_ORIGIN = "http://allowed.example"
EVIL_ORIGIN = "http://evil.example"
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1}
JSON_HEADERS = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("serve-hardening") / "server.log"
    command = [sys.executable, "-m", "goose", "serve", "--model", MODEL, "--dtype", "float32", "--device", DEVICE,
               "--threads", os.environ.get("GOOSE_TEST_THREADS", "2"), "--port", str(port),
               "--body-timeout", str(BODY_TIMEOUT_S), "--header-timeout", str(HEADER_TIMEOUT_S),
               "--cors-origin", ALLOWED_ORIGIN]
    running = start_server(command, port, log)
    process = running.process
    yield running
    if process.poll() is None:  # the SIGTERM test did not run (deselected or failed early)
        process.kill()
        process.wait(timeout=30)


def _still_open(connection: socket.socket) -> bool:
    """Whether the server has neither closed ``connection`` nor answered on it (a peek, nothing read)."""
    connection.setblocking(False)
    try:
        connection.recv(1, socket.MSG_PEEK)  # bytes (an answer) or b"" (closed)
    except BlockingIOError:
        return True
    finally:
        connection.setblocking(True)
    return False


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _generations(server: Server) -> float:
    return sum(v for (name, _), v in server.metrics().items() if name == "goose_generations_total")


def _requests(server: Server, route: str, code: str) -> float:
    return server.metrics().get(("goose_http_requests_total", (("code", code), ("route", route))), 0.0)


def _assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    assert error["code"] == code, error
    return error


def _raw(port: int, request: bytes, *, timeout_s: float = 10.0) -> bytes:
    """Sends ``request`` on a fresh connection and reads until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as connection:
        connection.sendall(request)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
        return received


# --- who may call ---------------------------------------------------------------------------------


def test_a_browser_pages_simple_post_is_refused_before_any_generation(server: Server) -> None:
    before = _generations(server)
    port = _port(server)
    body = json.dumps({"prompt": "Once", "max_tokens": 4})
    browser = {"Content-Type": "text/plain;charset=UTF-8", "Origin": EVIL_ORIGIN}
    # what the page sends as it is (its own name in Host, as after DNS rebinding) ...
    rebound = httpx.post(server.url + "/v1/completions", content=body, timeout=30,
                         headers={**browser, "Host": f"evil.example:{port}"})
    _assert_error(rebound, 403, "host_not_allowed")
    # ... and to http://127.0.0.1:PORT directly: the foreign Origin, then the content type, each refused
    _assert_error(httpx.post(server.url + "/v1/completions", content=body, headers=browser, timeout=30),
                  403, "origin_not_allowed")
    _assert_error(httpx.post(server.url + "/v1/completions", content=body, timeout=30,
                             headers={"Content-Type": "text/plain;charset=UTF-8"}), 415, "unsupported_media_type")
    for form in ("application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                 "application/json; charset=latin-1"):
        _assert_error(httpx.post(server.url + "/v1/completions", content=body, headers={"Content-Type": form},
                                 timeout=30), 415, "unsupported_media_type")
    _assert_error(httpx.post(server.url + "/v1/completions", content=body, timeout=30), 415, "unsupported_media_type")
    assert _generations(server) == before  # nothing reached the model
    assert _requests(server, "/v1/completions", "403") >= 2 and _requests(server, "/v1/completions", "415") >= 5


def test_dns_rebinding_host_is_refused_and_local_names_are_not(server: Server) -> None:
    port = _port(server)
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}", f"localhost.evil.example:{port}",
                 f"127.0.0.1.evil.example:{port}", ""):
        _assert_error(httpx.get(server.url + "/v1/models", headers={"Host": host}, timeout=30), 403,
                      "host_not_allowed")
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
        assert httpx.get(server.url + "/v1/models", headers={"Host": host}, timeout=30).status_code == 200, host


def test_clients_that_must_keep_working_do(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    answer = client.chat.completions.create(model=MODEL, max_tokens=2, messages=CHAT["messages"])
    assert answer.choices[0].message.content
    for content_type in ("application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"):
        curl_like = httpx.post(server.url + "/v1/completions", content=json.dumps({"prompt": "Hi", "max_tokens": 1}),
                               headers={"Content-Type": content_type}, timeout=120)  # curl -H 'Content-Type: ...'
        assert curl_like.status_code == 200, (content_type, curl_like.text)


def test_an_allowed_cors_origin_gets_preflight_and_headers(server: Server) -> None:
    preflight = httpx.options(server.url + "/v1/chat/completions", timeout=30, headers={
        "Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    called = httpx.post(server.url + "/v1/chat/completions", json=CHAT, headers={"Origin": ALLOWED_ORIGIN},
                        timeout=120)
    assert called.status_code == 200 and called.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    evil_preflight = httpx.options(server.url + "/v1/chat/completions", timeout=30, headers={
        "Origin": EVIL_ORIGIN, "Access-Control-Request-Method": "POST"})
    _assert_error(evil_preflight, 403, "origin_not_allowed")
    assert "access-control-allow-origin" not in evil_preflight.headers


# --- clients that leave, dawdle or flood ------------------------------------------------------------


def _log_errors(server: Server) -> list[str]:
    return [line for line in server.log.read_text().splitlines() if "ERROR" in line or "Traceback" in line]


def test_a_half_sent_upload_logs_no_error_and_counts_499(server: Server) -> None:
    port = _port(server)
    gone_before = _requests(server, "/v1/completions", "499")
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(head + b'{"prompt":')  # ten bytes of the hundred, then away
    deadline = time.monotonic() + 10
    while _requests(server, "/v1/completions", "499") < gone_before + 1:
        assert time.monotonic() < deadline, "the dropped upload was never counted as 499"
        time.sleep(0.1)
    assert _log_errors(server) == []
    assert "the client went away" in server.log.read_text()


def test_a_stalled_upload_is_answered_408_and_closed_within_the_body_timeout(server: Server) -> None:
    port = _port(server)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n").encode()
    started = time.monotonic()
    answer = _raw(port, head + b'{"prompt":')  # and then nothing: the server must not wait for ever
    waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert BODY_TIMEOUT_S - 0.2 <= waited <= BODY_TIMEOUT_S + 1.5, waited
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert _log_errors(server) == []


def test_50_slow_connections_leave_health_answering_and_are_closed(server: Server) -> None:
    port = _port(server)
    slow: list[socket.socket] = []
    try:
        for index in range(50):
            connection = socket.create_connection(("127.0.0.1", port), timeout=10)
            if index % 2:  # headers that never end
                connection.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode())
            else:  # a body that never ends
                connection.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: "
                                   "application/json\r\nContent-Length: 1000\r\n\r\n{".encode())
            slow.append(connection)
        trickling = threading.Event()

        def trickle() -> None:  # one more that sends a header byte every 0.2 s (no keep-alive timer stops it)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
                connection.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode())
                try:
                    while not trickling.is_set():
                        connection.sendall(b"a")
                        time.sleep(0.2)
                except OSError:  # closed by the server: what should happen
                    trickling.set()

        trickler = threading.Thread(target=trickle, daemon=True)
        trickler.start()
        answered = _requests(server, "/health", "200")
        for _ in range(5):
            assert server.get("/health").status_code == 200
        # answered while the slow connections were still held: a server that served /health only once their
        # deadlines had closed them would leave none open here (an order of events, not a time that moves with load)
        assert sum(_still_open(connection) for connection in slow) > 0
        assert _requests(server, "/health", "200") - answered == 5
        # every one of them is closed by the server within its deadline (plus a little)
        deadline = time.monotonic() + max(HEADER_TIMEOUT_S, BODY_TIMEOUT_S + 1) + 3
        for connection in slow:
            connection.settimeout(max(0.1, deadline - time.monotonic()))
            received = b""
            while chunk := connection.recv(65536):  # EOF, or a 408 then EOF
                received += chunk
            assert received == b"" or received.startswith(b"HTTP/1.1 408"), received[:100]
        trickler.join(timeout=max(0.1, deadline - time.monotonic()))
        assert trickling.is_set(), "the trickling connection was never closed"
    finally:
        for connection in slow:
            connection.close()
    assert server.get("/health").status_code == 200 and _log_errors(server) == []


def test_oversized_and_broken_headers_are_refused_in_the_error_shape(server: Server) -> None:
    port = _port(server)
    big = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Big: {'a' * (20 << 10)}\r\n\r\n".encode()
    answer = _raw(port, big)  # in one piece: parsed, then refused by the guard
    assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
    unfinished = _raw(port, big[:-4])  # headers without their end: h11 stops buffering past the limit
    for refused in (unfinished, _raw(port, b"NOT HTTP AT ALL\r\n\r\n")):
        assert refused.startswith(b"HTTP/1.1 400"), refused[:100]
        assert json.loads(refused.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "invalid_http"


def test_rejected_big_bodies_give_their_memory_back(server: Server) -> None:
    def rss_mb() -> float:
        with open(f"/proc/{server.process.pid}/status") as status_file:
            status = status_file.read()
        return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]) / 1024

    if not os.path.exists(f"/proc/{server.process.pid}/status"):
        pytest.skip("needs /proc")
    long_prompt = json.dumps({"prompt": "goose " * ((4 << 20) // 6 - 10)}).encode()
    long_chat = json.dumps({"messages": [{"role": "user", "content": "goose " * ((4 << 20) // 6 - 10)}]}).encode()
    too_big = b'{"prompt": "' + b"x" * (5 << 20) + b'"}'
    server.post("/v1/completions", None, raw=long_prompt)  # one first: what any big request allocates once
    before, generations = rss_mb(), _generations(server)
    refused = {(route, code): _requests(server, route, code) for route in ("/v1/completions", "/v1/chat/completions")
               for code in ("400", "413")}
    sent, statuses = 0, []
    for _ in range(6):
        statuses.append(server.post("/v1/completions", None, raw=long_prompt).status_code)
        statuses.append(server.post("/v1/chat/completions", None, raw=long_chat).status_code)
        sent += len(long_prompt) + len(long_chat)
    for _ in range(3):
        statuses.append(server.post("/v1/completions", None, raw=too_big).status_code)
        sent += len(too_big)
    assert statuses == [400] * 12 + [413] * 3
    # what the server did with them: counted each refusal, started no generation
    assert _generations(server) == generations
    assert {key: _requests(server, *key) - count for key, count in refused.items()} == {
        ("/v1/completions", "400"): 6, ("/v1/chat/completions", "400"): 6, ("/v1/completions", "413"): 3,
        ("/v1/chat/completions", "413"): 0}
    # memory: bounded by what it was sent, not by this machine: keeping the 15 bodies (63 MB) would grow the
    # process by at least their bytes; giving them back leaves less than two bodies' worth
    grown = (rss_mb() - before) * (1 << 20)
    assert grown < 2 * len(too_big), (before, rss_mb(), sent)


# --- docs, error codes ------------------------------------------------------------------------------


def test_docs_are_closed_by_default(server: Server) -> None:
    for path in ("/docs", "/openapi.json", "/redoc"):
        _assert_error(server.get(path), 404, "not_found")


def test_docs_when_asked_for_are_behind_the_key(smollm2: Any) -> None:
    _, tokenizer = smollm2
    engine = SimpleNamespace(tokenizer=tokenizer, vocab_size=49152, context=8192, metrics=ServerMetrics(),
                             alive=True)
    app = create_app(engine, MODEL, api_key="k", hosts=HostRule("127.0.0.1"), docs=True)  # type: ignore[arg-type]
    client = TestClient(app, base_url="http://127.0.0.1:8000")
    for path in ("/docs", "/openapi.json"):
        assert client.get(path).status_code == 401
    assert client.get("/docs", headers={"Authorization": "Bearer k"}).text.lstrip().startswith("<!DOCTYPE html>")
    spec = client.get("/openapi.json", headers={"Authorization": "Bearer k"}).json()
    assert "/v1/chat/completions" in spec["paths"]


BAD_BODIES: list[tuple[str, bytes]] = [
    ("/v1/chat/completions", json.dumps({**CHAT, "sources": ["nope"]}).encode()),
    ("/v1/chat/completions", json.dumps({**CHAT, "topology": "nope"}).encode()),
    ("/v1/completions", json.dumps({"prompt": [1, 10**9]}).encode()),
    ("/v1/completions", b'{"prompt": "\\ud800"}'),
    ("/v1/completions", b'{"prompt": "\\udc00 x"}'),
    ("/v1/completions", b'{"prompt": '),
    ("/v1/completions", b"[1]"),
    ("/v1/completions", json.dumps({"prompt": "hi", "n": 17}).encode()),
    ("/v1/completions", json.dumps({"prompt": "hi", "wibble": 1}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": []}).encode()),
    ("/v1/chat/completions", json.dumps({**CHAT, "max_tokens": 10**6}).encode()),
]


def test_every_400_has_a_code(server: Server) -> None:
    for route, body in BAD_BODIES:
        response = server.post(route, None, raw=body)
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert isinstance(error["code"], str) and error["code"], (body, error)
    surrogate = server.post("/v1/completions", None, raw=b'{"prompt": "\\ud800"}').json()["error"]
    assert surrogate["code"] == "invalid_json" and "surrogate" in surrogate["message"]


@pytest.mark.parametrize(("flags", "message"), [(["--body-timeout", "0"], "--body-timeout"),
                                                (["--header-timeout", "-1"], "--header-timeout"),
                                                (["--max-connections", "1"], "--max-connections")])
def test_serve_cli_rejects_bad_limits(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", *flags]) == 2  # refused before any model is loaded
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("bind", "host", "allowed"), [
    ("0.0.0.0", "192.168.1.7:8000", True), ("0.0.0.0", "evil.example:8000", False),
    ("0.0.0.0", "192.168.1.7:9000", False), ("::1", "[::1]:8000", True), ("::1", "localhost:8000", True),
    ("192.168.1.7", "127.0.0.1:8000", False), ("192.168.1.7", "192.168.1.7:8000", True),
    ("127.0.0.1", "127.0.0.1", False),  # port 80 implied
])
def test_host_rule(bind: str, host: str, allowed: bool) -> None:
    assert HostRule(bind).allows(host, 8000) is allowed
    assert HostRule(bind, ["evil.example"]).allows("evil.example:1234", 8000)  # a name given: any port
    assert HostRule(bind, ["*"]).allows("anything", 8000)


# --- last: the module's server is stopped here ------------------------------------------------------


def test_sigterm_drains_the_stream_and_exits_0(server: Server) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as streamed:
        lines = streamed.iter_lines()
        next(lines)  # generating now
        server.process.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line]
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        pytest.fail("goose serve did not stop within 30 s of SIGTERM")
    log = server.log.read_text()
    assert server.process.returncode == 0, log[-3000:]
    assert rest[-1] == "data: [DONE]" and "shutting_down" in "".join(rest)
    assert log.rstrip().endswith("goose serve: stopped"), log[-1000:]
    assert "Traceback" not in log
