"""The FastAPI app: OpenAI's routes over one Engine, plus /health and /metrics (and /docs with ``docs``).

Bodies are parsed by the request models themselves (not FastAPI's body injection) so that every
problem, from bad JSON to a bad value, is a 400 in OpenAI's error shape naming the field. What may
reach the routes at all (Host, Origin, a JSON content type, the body's size and read deadline) is
decided before them by ``RequestGuard`` (goose/serve/guard.py). Nothing a client sends reaches the
worker unchecked: the prompt is encoded and fitted to the context before the request queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import goose
from goose.cycle.sampling import SamplingParams, choice_seed, random_seed
from goose.serve.engine import Engine, QueueFullError
from goose.serve.errors import APIError, from_validation_error
from goose.serve.guard import HostRule, HttpMiddleware, RequestGuard
from goose.serve.job import Decoding, Delta, Event, Failed, Finished, Job
from goose.serve.prompts import PromptEncoder
from goose.serve.responses import DONE, ChatFormat, CompletionFormat, sse
from goose.serve.schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest, ModelCard, ModelList

logger = logging.getLogger("goose.serve")

MAX_BODY_BYTES = 4 << 20  # a prompt that fills an 8k-token context is well under 100 kB
BODY_TIMEOUT_S = 30.0
DISCONNECT_POLL_S = 0.25
CLIENT_GONE = 499  # nginx's status for a client that closed the connection before its answer was complete
ROUTES = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics", "/docs", "/openapi.json")

RequestModel = TypeVar("RequestModel", bound=BaseModel)
Format = ChatFormat | CompletionFormat


class ClientGone(Exception):
    """The client disconnected while its request waited or ran."""


def create_app(engine: Engine, model_name: str, *, api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, hosts: HostRule | None = None,
               cors_origins: tuple[str, ...] = (), body_timeout_s: float = BODY_TIMEOUT_S,
               docs: bool = False) -> FastAPI:
    """An app serving ``engine``'s model as ``model_name``; with ``api_key``, /v1 wants ``Bearer <key>``.

    ``hosts`` says which Host headers name this server (default: loopback); ``cors_origins`` are the
    browser origins allowed to call it (default none); ``docs`` serves /docs and /openapi.json
    (behind the key when there is one).
    """
    encoder = PromptEncoder(engine.tokenizer, engine.vocab_size, engine.context)
    metrics = engine.metrics
    started = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if not engine.alive:
            engine.start()
        yield
        engine.close()

    # FastAPI's own /docs, /redoc and /openapi.json are open to anyone: off, and ours below only with docs
    app = FastAPI(title="Goose", version=goose.__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None,
                  description="OpenAI-compatible completions decoded with Goose speculative decoding")
    # added last = outermost: every request is counted, the guard's refusals too; CORS answers preflights
    # only for origins the guard let through
    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["authorization", "content-type"], max_age=600)
    app.add_middleware(RequestGuard, hosts=hosts or HostRule("127.0.0.1"), cors_origins=cors_origins,
                       max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s)
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
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "invalid_request")
        return _error_response(APIError(error.status_code, str(error.detail), code=code,
                                        headers=dict(error.headers or {})))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:  # path parameters
        return _error_response(APIError(400, str(error.errors()[0].get("msg", "invalid request")),
                                        code="invalid_value"))

    @app.exception_handler(ClientDisconnect)
    async def client_gone(_: Request, __: ClientDisconnect) -> Response:
        # the guard reads bodies before the routes do, so this is only a safety net; CountRequests logs it
        return Response(status_code=CLIENT_GONE)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, error: Exception) -> JSONResponse:
        logger.error("request failed", exc_info=error)
        return _error_response(APIError(500, "internal server error", code="internal_error"))

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

    async def generate(request: Request, body: CompletionRequest | ChatCompletionRequest, endpoint: str,
                       encode: Callable[[], list[int]], wire: Format) -> Response:
        """Either endpoint once its body is parsed: settings checked, prompt encoded, a job per choice, answered."""
        decoding, sampling = engine.decoding(body.sources, body.topology, body.budget), _sampling(body)
        prompt_ids = await run_in_threadpool(encode)
        max_tokens = encoder.token_limit(prompt_ids, *body.token_limit)
        prediction = await _prediction_ids(encoder, body, prompt_ids)
        jobs = _jobs(engine, endpoint, body, prompt_ids, max_tokens, decoding, sampling, prediction,
                     body.top_alternatives)
        return await _answer(engine, jobs, request, body.stream, wire)

    @app.post("/v1/completions", dependencies=[Depends(authorized)],
              openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request) -> Response:
        body = _parse(CompletionRequest, await request.body())
        return await generate(request, body, "completions", partial(encoder.completion, body.prompt),
                              CompletionFormat(model_name))

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)],
              openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        body = _parse(ChatCompletionRequest, await request.body())
        return await generate(request, body, "chat", partial(encoder.chat, body.messages), ChatFormat(model_name))

    if docs:
        @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(authorized)])
        async def openapi() -> JSONResponse:
            return JSONResponse(app.openapi())

        @app.get("/docs", include_in_schema=False, dependencies=[Depends(authorized)])
        async def swagger() -> HTMLResponse:
            return get_swagger_ui_html(openapi_url="/openapi.json", title="Goose - API")

    return app


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


# --- one generation request, end to end ---------------------------------------------------------


async def _answer(engine: Engine, jobs: list[Job], request: Request, stream: bool, wire: Format) -> Response:
    """Queue the request's jobs (one per choice), then answer with the whole result or open the event stream at
    the first token."""
    if len(jobs) > engine.max_queue:
        raise APIError(400, f"n: {len(jobs)} choices cannot queue together on this server (--max-queue "
                       f"{engine.max_queue})", param="n")
    submitted: list[Job] = []
    try:
        for job in jobs:
            engine.submit(job)
            submitted.append(job)
    except (QueueFullError, APIError) as refused:
        for job in submitted:  # all choices or none: the ones already queued are skipped
            job.cancel()
        if isinstance(refused, APIError):
            raise
        raise APIError(503, f"the server is busy: {engine.max_queue} requests are already waiting; retry after "
                       f"{refused.retry_after_s} s", code="queue_full",
                       headers={"Retry-After": str(refused.retry_after_s)}) from None
    events = _Events(jobs, request)
    try:
        if stream:
            first = await events.next_watching_disconnect()
        else:  # every choice to its end
            finished: list[Finished | None] = [None] * len(jobs)
            while any(choice is None for choice in finished):
                index, event = await events.next_watching_disconnect()
                if isinstance(event, Failed):
                    events.close()
                    raise event.error
                if isinstance(event, Finished):
                    finished[index] = event
            return JSONResponse(wire.response([choice for choice in finished if choice is not None]))
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; the jobs were cancelled
    if isinstance(first[1], Failed):
        events.close()
        raise first[1].error
    return StreamingResponse(_event_stream(first, events, wire), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _event_stream(first: tuple[int, Event], events: _Events, wire: Format) -> AsyncIterator[str]:
    """Server-sent events from the jobs' events, each chunk naming its choice. A client that goes away cancels
    every job (finally)."""
    try:
        for opening in wire.opening(len(events.jobs)):
            yield opening
        finished: list[Finished | None] = [None] * len(events.jobs)
        index, event = first
        while True:
            if isinstance(event, Delta):
                if event.text or event.logprobs:
                    yield wire.delta(event, index)
            elif isinstance(event, Finished):
                finished[index] = event
                yield wire.finish(event, index)
                if all(choice is not None for choice in finished):
                    yield wire.totals([choice for choice in finished if choice is not None])
                    yield DONE
                    return
            else:  # failed after the stream began: the status line is sent, so the error goes in-band
                yield sse(event.error.body())
                yield DONE
                return
            index, event = await events.next()
    finally:
        events.close()


class _Events:
    """Reads the events of a request's jobs (one per choice) as they come; while no response has started it also
    notices a client that disconnects."""

    def __init__(self, jobs: list[Job], request: Request) -> None:
        self.jobs = jobs
        self.request = request
        self._pending: dict[int, asyncio.Task[Event]] = {}  # choice -> its get(), so that no event is lost
        self._ended: set[int] = set()  # choices whose last event was read
        self._next_check = time.monotonic() + DISCONNECT_POLL_S

    async def next(self, timeout_s: float | None = None) -> tuple[int, Event]:
        """The next event of any choice, as (choice, event); ``TimeoutError`` after ``timeout_s``."""
        for index, job in enumerate(self.jobs):
            if index not in self._pending and index not in self._ended:
                self._pending[index] = asyncio.ensure_future(job.events.get())
        done, _ = await asyncio.wait(set(self._pending.values()), timeout=timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if not done:
            raise TimeoutError
        index = min(i for i, task in self._pending.items() if task in done)  # the lowest choice first: stable
        event = self._pending.pop(index).result()
        if not isinstance(event, Delta):
            self._ended.add(index)
        return index, event

    async def next_watching_disconnect(self) -> tuple[int, Event]:
        while True:
            # checked by the clock, not only when no event comes: a request that is not streamed gets an
            # event every cycle and would otherwise never look
            if time.monotonic() >= self._next_check:
                self._next_check = time.monotonic() + DISCONNECT_POLL_S
                if await self.request.is_disconnected():
                    self.close()
                    raise ClientGone()
            with contextlib.suppress(TimeoutError):
                return await self.next(DISCONNECT_POLL_S)

    def close(self) -> None:
        for job in self.jobs:
            job.cancel()
        for task in self._pending.values():
            task.cancel()
        self._pending.clear()


# --- parsing ------------------------------------------------------------------------------------


def _parse(model: type[RequestModel], body: bytes) -> RequestModel:
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        raise from_validation_error(error) from None


async def _prediction_ids(encoder: PromptEncoder, body: GenerationRequest, prompt_ids: list[int]) -> list[int] | None:
    if body.prediction is None:
        return None
    return await run_in_threadpool(encoder.prediction, body.prediction.text, prompt_ids)


def _jobs(engine: Engine, endpoint: str, body: GenerationRequest, prompt_ids: list[int], max_tokens: int,
          decoding: Decoding, sampling: dict[str, Any], prediction: list[int] | None,
          logprobs: int | None) -> list[Job]:
    """The request's jobs, one per choice (``n``), each with its own sampling settings."""
    return [Job(endpoint, prompt_ids, max_tokens, body.stop_sequences, decoding, choice_sampling,
                asyncio.get_running_loop(), body.ignore_eos, prediction, body.structured_output(), logprobs=logprobs)
            for choice_sampling in _choices(engine, sampling, body.n or 1)]


def _choices(engine: Engine, sampling: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Each choice's sampling settings. Sampled, choice i draws with ``choice_seed(seed, i)`` from the request's
    seed (a random one when it gave none and the server has none), so every choice is reproducible on its own;
    greedy, every choice is the one output."""
    if n == 1:
        return [sampling]
    effective = engine.config.sampling_params().model_copy(update=sampling)
    if effective.greedy:
        return [sampling] * n
    seed = effective.seed if effective.seed is not None else random_seed()
    return [{**sampling, "seed": choice_seed(seed, index)} for index in range(n)]


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


# --- ASGI middleware (HttpMiddleware: plain ASGI, streaming responses pass through untouched) -----
# (RequestGuard, in guard.py, checks Host, Origin, content type and reads the body within its limits)


class CountRequests(HttpMiddleware):
    """Counts every HTTP request by route and status code; 499 when the client left before its answer ended.

    A client that goes away (mid-upload, while its generation waits or runs, mid-stream) is one
    info line here, never a traceback.
    """

    def __init__(self, app: ASGIApp, count: Callable[[str, str], None]) -> None:
        super().__init__(app)
        self.count = count

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        route = path if path in ROUTES else ("/v1/models/{id}" if path.startswith("/v1/models/") else "other")
        status: list[int] = []
        answered = gone = False

        async def watched() -> Message:
            nonlocal gone
            message = await receive()
            gone = gone or message["type"] == "http.disconnect"
            return message

        async def recorded(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                status.append(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        try:
            await self.app(scope, watched, recorded)
        finally:
            code = CLIENT_GONE if gone and not answered else (status[0] if status else None)
            if code == CLIENT_GONE:
                logger.info("%s %s: the client went away before its answer was complete (%d)", scope["method"],
                            path, CLIENT_GONE)
            self.count(route, str(code) if code is not None else "none")
