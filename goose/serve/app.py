"""The FastAPI app: OpenAI's routes over one Engine, plus /health and /metrics.

Bodies are parsed by the request models themselves (not FastAPI's body injection) so that every
problem, from bad JSON to a bad value, is a 400 in OpenAI's error shape naming the field, and a
curl without a JSON content type still works. Nothing a client sends reaches the worker unchecked:
the prompt is encoded and fitted to the context before the request queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import goose
from goose.cycle.sampling import SamplingParams
from goose.serve.engine import Delta, Engine, Event, Failed, Finished, Job, QueueFullError
from goose.serve.errors import APIError, from_validation_error
from goose.serve.prompts import PromptEncoder
from goose.serve.responses import DONE, ChatFormat, CompletionFormat, sse
from goose.serve.schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest, ModelCard, ModelList

logger = logging.getLogger("goose.serve")

MAX_BODY_BYTES = 4 << 20  # a prompt that fills an 8k-token context is well under 100 kB
DISCONNECT_POLL_S = 0.25
ROUTES = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics")

RequestModel = TypeVar("RequestModel", bound=BaseModel)
Format = ChatFormat | CompletionFormat


class ClientGone(Exception):
    """The client disconnected while its request waited or ran."""


def create_app(engine: Engine, model_name: str, *, api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """An app serving ``engine``'s model as ``model_name``; with ``api_key``, /v1 wants ``Bearer <key>``."""
    encoder = PromptEncoder(engine.tokenizer, engine.vocab_size, engine.context)
    metrics = engine.metrics
    started = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if not engine.alive:
            engine.start()
        yield
        engine.close()

    app = FastAPI(title="Goose", version=goose.__version__, lifespan=lifespan,
                  description="OpenAI-compatible completions decoded with Goose speculative decoding")
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(CountRequests, count=lambda route, code: metrics.http_requests.labels(route, code).inc())

    async def authorized(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> JSONResponse:
        return _error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:  # 404, 405
        return _error_response(APIError(error.status_code, str(error.detail), headers=dict(error.headers or {})))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:  # path parameters
        return _error_response(APIError(400, str(error.errors()[0].get("msg", "invalid request"))))

    @app.exception_handler(Exception)
    async def internal_error(_: Request, error: Exception) -> JSONResponse:
        logger.error("request failed", exc_info=error)
        return _error_response(APIError(500, "internal server error"))

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {"status": "ok" if engine.alive else "down", "model": model_name, "busy": engine.busy,
                "waiting": engine.waiting, "max_queue": engine.max_queue}
        return JSONResponse(body, status_code=200 if engine.alive else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def list_models() -> dict[str, Any]:
        return ModelList(data=[ModelCard(id=model_name, created=started)]).model_dump()

    @app.get("/v1/models/{model_id:path}", dependencies=[Depends(authorized)])
    async def get_model(model_id: str) -> dict[str, Any]:
        if model_id != model_name:
            raise APIError(404, f"the model {model_id!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")
        return ModelCard(id=model_name, created=started).model_dump()

    @app.post("/v1/completions", dependencies=[Depends(authorized)],
              openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request) -> Response:
        body = _parse(CompletionRequest, await request.body())
        decoding, sampling = engine.decoding(body.sources, body.topology, body.budget), _sampling(body)
        prompt_ids = await run_in_threadpool(encoder.completion, body.prompt)
        max_tokens = encoder.token_limit(prompt_ids, body.max_tokens)
        job = Job("completions", prompt_ids, max_tokens, body.stop_sequences, decoding, sampling,
                  asyncio.get_running_loop(), body.ignore_eos)
        return await _answer(engine, job, request, body.stream, CompletionFormat(model_name))

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)],
              openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        body = _parse(ChatCompletionRequest, await request.body())
        decoding, sampling = engine.decoding(body.sources, body.topology, body.budget), _sampling(body)
        prompt_ids = await run_in_threadpool(encoder.chat, body.messages)
        limit_field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        max_tokens = encoder.token_limit(prompt_ids, body.token_limit, limit_field)
        job = Job("chat", prompt_ids, max_tokens, body.stop_sequences, decoding, sampling, asyncio.get_running_loop(),
                  body.ignore_eos)
        return await _answer(engine, job, request, body.stream, ChatFormat(model_name))

    return app


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


# --- one generation request, end to end ---------------------------------------------------------


async def _answer(engine: Engine, job: Job, request: Request, stream: bool, wire: Format) -> Response:
    """Queue the job, then answer with the whole result or open the event stream at its first token."""
    try:
        engine.submit(job)
    except QueueFullError as full:
        raise APIError(503, f"the server is busy: {engine.max_queue} requests are already waiting; retry after "
                       f"{full.retry_after_s} s", code="queue_full",
                       headers={"Retry-After": str(full.retry_after_s)}) from None
    events = _Events(job, request)
    try:
        first = await events.next_watching_disconnect()
        while not stream and isinstance(first, Delta):
            first = await events.next_watching_disconnect()
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; the job was cancelled
    if isinstance(first, Failed):
        raise first.error
    if not stream:
        assert isinstance(first, Finished)
        return JSONResponse(wire.response(first))
    return StreamingResponse(_event_stream(first, events, wire), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _event_stream(first: Event, events: _Events, wire: Format) -> AsyncIterator[str]:
    """Server-sent events from the job's events. A client that goes away cancels the job (finally)."""
    try:
        for opening in wire.opening():
            yield opening
        event = first
        while True:
            if isinstance(event, Delta):
                if event.text:
                    yield wire.delta(event.text)
            elif isinstance(event, Finished):
                for closing in wire.closing(event):
                    yield closing
                yield DONE
                return
            else:  # failed after the stream began: the status line is sent, so the error goes in-band
                yield sse(event.error.body())
                yield DONE
                return
            event = await events.next()
    finally:
        events.close()


class _Events:
    """Reads a job's events; while no response has started it also notices a client that disconnects."""

    def __init__(self, job: Job, request: Request) -> None:
        self.job = job
        self.request = request
        self._pending: asyncio.Task[Event] | None = None
        self._next_check = time.monotonic() + DISCONNECT_POLL_S

    async def next(self) -> Event:
        return await self.job.events.get()

    async def next_watching_disconnect(self) -> Event:
        # one get() task, polled, so that an event is never lost to a timeout
        self._pending = self._pending or asyncio.ensure_future(self.job.events.get())
        while True:
            # checked by the clock, not only when no event comes: a request that is not streamed gets an
            # event every cycle and would otherwise never look
            if time.monotonic() >= self._next_check:
                self._next_check = time.monotonic() + DISCONNECT_POLL_S
                if await self.request.is_disconnected():
                    self.close()
                    raise ClientGone()
            done, _ = await asyncio.wait({self._pending}, timeout=DISCONNECT_POLL_S)
            if done:
                event, self._pending = self._pending.result(), None
                return event

    def close(self) -> None:
        self.job.cancel()
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


# --- parsing ------------------------------------------------------------------------------------


def _parse(model: type[RequestModel], body: bytes) -> RequestModel:
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        raise from_validation_error(error) from None


def _sampling(body: GenerationRequest) -> dict[str, Any]:
    """The request's sampling settings, checked; only those it set are passed on (the decoder's defaults hold)."""
    fields = {key: getattr(body, key) for key in ("temperature", "top_p", "top_k", "seed")
              if getattr(body, key) is not None}
    try:
        SamplingParams.model_validate(fields)
    except ValidationError as error:
        raise from_validation_error(error) from None
    return fields


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


# --- ASGI middleware (plain ASGI: streaming responses pass through untouched) --------------------


class BodyLimit:
    """413 for a body over ``max_bytes`` (by its Content-Length; a chunked one is cut off when it exceeds it)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = APIError(413, f"the request body is larger than {self.max_bytes} bytes")
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_bytes:
            error = too_large if length.isdigit() else APIError(400, "bad Content-Length header")
            await _error_response(error)(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise too_large  # reaches the app's APIError handler through request.body()
            return message

        await self.app(scope, limited, send)


class CountRequests:
    """Counts every answered HTTP request by route and status code."""

    def __init__(self, app: ASGIApp, count: Callable[[str, str], None]) -> None:
        self.app = app
        self.count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = path if path in ROUTES else ("/v1/models/{id}" if path.startswith("/v1/models/") else "other")
        status: list[int] = []

        async def recorded(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recorded)
        finally:
            self.count(route, str(status[0]) if status else "none")

