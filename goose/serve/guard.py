"""What stands between the network and the app: who may call, what a body may be, how long it may take.

A server on 127.0.0.1 without a key is still reachable from every web page the user opens: a page
may POST to it (a "simple" request, ``text/plain``, needs no CORS preflight), and a DNS-rebinding
page (its own name re-pointed at 127.0.0.1) may even read the answer. ``RequestGuard`` refuses
both before a byte of the body is read: a ``Host`` that is not this server's (403), an ``Origin``
that is not allowed (403), a body that is not ``application/json`` (415). It then reads the body
itself, within a size limit and a deadline, and hands it to the app in one piece, so the app never
waits on a slow or vanished client.

``GuardedH11Protocol`` is the same rule one layer down, where the ASGI app cannot reach: a
connection that takes too long to send its request headers, or its body after an early answer,
is closed (uvicorn alone keeps both open for as long as the client likes).
"""

from __future__ import annotations

import asyncio
import ctypes
import ipaddress
import json
import logging
import time
from collections.abc import Callable, Iterable

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from goose.serve.errors import APIError

logger = logging.getLogger("goose.serve")

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
# headers together: h11 closes a connection whose unfinished headers pass it (only then: it buffers no
# more), and RequestGuard answers 431 to finished ones that do (they came in one read)
MAX_HEADER_BYTES = 16 << 10
JSON_MEDIA_TYPE = "application/json"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
TRIM_AFTER_BODY_BYTES = 1 << 20


def error_response_messages(error: APIError, *, close: bool = False) -> tuple[Message, Message]:
    """The two ASGI messages of an error answer, built here so that the guard needs no framework."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in error.headers.items()]
    if close:  # the client stopped sending: nothing to wait for
        headers.append((b"connection", b"close"))
    return ({"type": "http.response.start", "status": error.status, "headers": headers},
            {"type": "http.response.body", "body": body, "more_body": False})


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::", "[::]")


def _split_host(value: str) -> tuple[str, int | None]:
    """``"name:8000"`` -> ``("name", 8000)``, ``"[::1]:8000"`` -> ``("[::1]", 8000)``; no port -> None."""
    if value.startswith("["):
        name, _, rest = value.partition("]")
        name += "]"
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    if port and not port.isdigit():
        return value, -1  # a port that is not a number matches nothing
    return name, int(port) if port else None


class HostRule:
    """Which ``Host`` headers name this server.

    Always: the address it listens on, with its port. Bound to loopback: also ``localhost``,
    ``127.0.0.1`` and ``[::1]`` with the port. Bound to every interface (0.0.0.0, ::): any IP
    address with the port (a DNS-rebinding page always sends its own *name*, never an address).
    Plus each ``--allowed-host`` name, with any port or none (a reverse proxy's name); ``*`` allows all.
    """

    def __init__(self, bind_host: str, allowed: Iterable[str] = ()) -> None:
        self.bind_host = bind_host.lower()
        self.allowed = {name.lower() for name in allowed}
        self.any = "*" in self.allowed
        self.names = {self._bracketed(self.bind_host)}
        if _is_loopback(self.bind_host):
            self.names |= set(LOOPBACK_NAMES)
        self.any_address = _is_wildcard(self.bind_host)

    @staticmethod
    def _bracketed(host: str) -> str:
        return f"[{host}]" if ":" in host and not host.startswith("[") else host

    def allows(self, header: str, port: int | None) -> bool:
        if self.any:
            return True
        if not header:
            return False  # HTTP/1.1 requires Host; only a hand-made request lacks one
        header = header.lower()
        if header in self.allowed:
            return True
        name, header_port = _split_host(header)
        if name in self.allowed:
            return True
        if port is not None and (header_port if header_port is not None else 80) != port:
            return False
        if name in self.names:
            return True
        return self.any_address and _is_ip_address(name)


def _is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def _json_content_type(value: str) -> bool:
    """``application/json``, with no parameter but an optional UTF-8 charset (JSON is UTF-8)."""
    media_type, *parameters = (part.strip().lower() for part in value.split(";"))
    if media_type != JSON_MEDIA_TYPE:
        return False
    for parameter in parameters:
        key, _, val = parameter.partition("=")
        if key.strip() != "charset" or val.strip().strip('"') not in ("utf-8", "utf8"):
            return False
    return True


class HttpMiddleware:
    """Plain ASGI middleware (streaming responses pass through untouched) of HTTP requests, in :meth:`http`;
    every other scope (the lifespan) goes straight to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class RequestGuard(HttpMiddleware):
    """Pure ASGI middleware: refuses foreign hosts and origins and non-JSON bodies, then reads the body.

    Refusals come before the body is read (and so before any generation). The body is read here,
    at most ``max_body_bytes`` (by Content-Length at once, else counted as it arrives) and within
    ``body_timeout_s`` (408 after that), then replayed to the app as one message.
    """

    def __init__(self, app: ASGIApp, *, hosts: HostRule, cors_origins: Iterable[str] = (),
                 max_body_bytes: int, body_timeout_s: float) -> None:
        super().__init__(app)
        self.hosts = hosts
        self.cors_origins = {origin.rstrip("/").lower() for origin in cors_origins}
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            # the connection stays open: uvicorn reads what is left of the body and drops it (within the
            # protocol's body deadline); closing at once would reset a client still sending it, before it
            # could read the answer
            for message in error_response_messages(refusal):
                await send(message)
            return
        if scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        body = await self._read_body(scope, receive, send)
        if body is None:  # answered (413, 408) or the client has gone
            return
        size = len(body)
        await self.app(scope, _replay(body, receive), send)
        if size > TRIM_AFTER_BODY_BYTES and _malloc_trim is not None:
            # a big body's copies (bytes, the parsed str, the tokenizer's work) are freed into glibc's
            # arenas, which keep them: measured, a dozen rejected 4 MB prompts kept +34 MB of RSS, with
            # the trim -6 MB. In a thread: it takes the arenas' locks, not the event loop
            await asyncio.get_running_loop().run_in_executor(None, _malloc_trim, 0)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> APIError | None:
        if sum(len(name) + len(value) + 4 for name, value in scope["headers"]) > MAX_HEADER_BYTES:
            return APIError(431, f"the request headers are larger than {MAX_HEADER_BYTES} bytes",
                            code="headers_too_large")
        server = scope.get("server")
        port = server[1] if server else None
        host = headers.get("host", "")
        if not self.hosts.allows(host, port):
            return APIError(403, f"the Host header {host!r} does not name this server; start it with "
                            "--allowed-host NAME to accept that name", code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin.rstrip("/").lower(), host.lower(), scope):
            return APIError(403, f"cross-origin requests from {origin!r} are not allowed; start the server with "
                            "--cors-origin ORIGIN to allow that origin", code="origin_not_allowed")
        if scope["method"] in BODY_METHODS and not _json_content_type(headers.get("content-type", "")):
            sent = headers.get("content-type")
            return APIError(415, f"the request body must be JSON with 'Content-Type: {JSON_MEDIA_TYPE}' "
                            f"(got {sent!r})" if sent else "the request body must be JSON: send the header "
                            f"'Content-Type: {JSON_MEDIA_TYPE}'", code="unsupported_media_type")
        length = headers.get("content-length")
        if length is not None and not length.isdigit():
            return APIError(400, "bad Content-Length header", code="invalid_header")
        if length is not None and int(length) > self.max_body_bytes:
            return _too_large(self.max_body_bytes)
        return None

    def _origin_allowed(self, origin: str, host: str, scope: Scope) -> bool:
        # a page this server served itself (the --docs page) is same-origin: its Host was checked already
        same_origin = origin == f"{scope.get('scheme', 'http')}://{host}"
        return same_origin or origin in self.cors_origins or "*" in self.cors_origins

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytearray | None:
        body = bytearray()
        deadline = time.monotonic() + self.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                logger.info("%s %s: the body was not received within %g s (408, connection closed)",
                            scope["method"], scope["path"], self.body_timeout_s)
                error = APIError(408, f"the request body was not received within {self.body_timeout_s:g} s",
                                 code="request_timeout")
                for answer in error_response_messages(error, close=True):
                    await send(answer)
                return None
            if message["type"] == "http.disconnect":
                return None  # CountRequests logs it and counts a 499
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:  # a chunked body, or more than its Content-Length said
                for answer in error_response_messages(_too_large(self.max_body_bytes)):
                    await send(answer)
                return None
            if not message.get("more_body", False):
                return body


def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


_malloc_trim = _libc_malloc_trim()


def _too_large(max_bytes: int) -> APIError:
    return APIError(413, f"the request body is larger than {max_bytes} bytes", code="request_too_large")


def _replay(body: bytearray, receive: Receive) -> Receive:
    """The body as one message, then the real receive (which reports a later disconnect)."""
    pending: list[Message] = [{"type": "http.request", "body": bytes(body), "more_body": False}]
    body.clear()

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed


# --- the transport layer ---------------------------------------------------------------------------


def guarded_protocol(header_timeout_s: float, body_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with deadlines on the request's headers and on the rest of its body."""

    class Guarded(GuardedH11Protocol):
        pass

    Guarded.header_timeout_s = header_timeout_s
    Guarded.body_timeout_s = body_timeout_s
    return Guarded


class GuardedH11Protocol(H11Protocol):
    """Closes a connection whose request headers take over ``header_timeout_s`` to arrive (slowloris),
    or whose body takes over ``body_timeout_s`` (plus a second, so that RequestGuard's 408 goes first).

    uvicorn arms no timer until a first response is complete, and every byte that arrives cancels
    its keep-alive timer, so without this a client that trickles bytes holds a connection for ever.
    The deadline covers a body the app never reads, too (one refused before it was read).
    """

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._watched_state: object = None
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """A request h11 cannot parse (or headers over the limit): the 400 in OpenAI's shape, then close."""
        error = APIError(400, f"invalid HTTP request: {msg}", code="invalid_http")
        start, body = error_response_messages(error, close=True)
        for event in (h11.Response(status_code=400, headers=start["headers"], reason=b"Bad Request"),
                      h11.Data(data=body["body"]), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _watch(self) -> None:
        """Arm the deadline of the request's current part: headers (IDLE), body (SEND_BODY), none after."""
        state = self.conn.their_state
        if state is self._watched_state:
            return
        self._disarm()
        self._watched_state = state
        if self.transport.is_closing():
            return
        if state is h11.IDLE:
            self._deadline = self.loop.call_later(self.header_timeout_s, self._expire, "headers")
        elif state is h11.SEND_BODY:
            self._deadline = self.loop.call_later(self.body_timeout_s + 1.0, self._expire, "body")

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, part: str) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            logger.info("%s did not send its request %s in time: connection closed", client, part)
            self.transport.close()
