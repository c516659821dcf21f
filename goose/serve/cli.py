"""``goose serve``: registers the subcommand; FastAPI and uvicorn are imported only when it runs."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import signal
import sys
from types import FrameType

from goose.cli import (
    add_decoding_arguments,
    add_model_arguments,
    decoding_config,
    load_model,
    weights,
)
from goose.hookspecs import Register, hookimpl

DEFAULT_MAX_BATCH = 4  # on the 2-core CPU of docs/results.md, four requests together beat one at a time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_decoding_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    parser.add_argument("--api-key", default=os.environ.get("GOOSE_API_KEY") or None,
                        help="require 'Authorization: Bearer KEY' on /v1 routes (default: $GOOSE_API_KEY, else open)")
    parser.add_argument("--max-queue", type=int, default=32,
                        help="requests that may wait for the model; one more is answered 503 (default 32)")
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, metavar="N",
                        help="requests decoded together, their trees verified in one pass; more wait in the queue "
                             f"(default {DEFAULT_MAX_BATCH}; 1: one at a time)")
    parser.add_argument("--max-cache-tokens", type=int, default=None, metavar="N",
                        help="KV cache budget of a batch, in positions over its --max-batch slots: a request whose "
                             "prompt + max_tokens exceed a slot's share is answered 400 (default: each slot holds "
                             "the model's context)")
    parser.add_argument("--served-model-name", default=None, help="the model's name in /v1/models (default: --model)")
    parser.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                        help="also accept requests whose Host header is NAME (any port; repeatable; '*': any). "
                        "By default only the --host address (and localhost names on loopback) with the port")
    parser.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                        help="let web pages from ORIGIN (e.g. http://localhost:3000; repeatable; '*': any) call "
                        "the server; by default cross-origin browser requests are refused")
    parser.add_argument("--docs", action="store_true",
                        help="serve /docs (Swagger UI) and /openapi.json, behind --api-key when one is set")
    parser.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                        help="seconds a client has to send its request body (default 30; 408 after)")
    parser.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                        help="seconds a connection has to send its request headers (default 10; closed after)")
    parser.add_argument("--max-connections", type=int, default=100, metavar="N",
                        help="open connections at most; a request beyond them is answered 503 (default 100)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                        help="server log level (default info: one line per request)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from goose.serve.app import create_app
        from goose.serve.engine import Engine
        from goose.serve.guard import MAX_HEADER_BYTES, HostRule, guarded_protocol
        from goose.serve.server import EngineServer
    except ImportError as error:
        if (error.name or "").split(".")[0] not in {"fastapi", "starlette", "uvicorn", "prometheus_client"}:
            raise
        raise ValueError(f"goose serve needs the serve extra ({error.name} is missing): "
                         "pip install 'goose-decoding[serve]'") from None
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if args.max_queue < 1:
        raise ValueError(f"--max-queue must be at least 1, got {args.max_queue}")
    if not 1 <= args.max_batch <= 64:
        raise ValueError(f"--max-batch must be in 1..64, got {args.max_batch}")
    if args.max_cache_tokens is not None and args.max_cache_tokens < 2 * args.max_batch:
        raise ValueError(f"--max-cache-tokens must be at least 2 per slot ({2 * args.max_batch}), "
                         f"got {args.max_cache_tokens}")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key is empty")
    for flag, seconds in (("--body-timeout", args.body_timeout), ("--header-timeout", args.header_timeout)):
        if not 0 < seconds <= 3600:
            raise ValueError(f"{flag} must be in (0, 3600] seconds, got {seconds}")
    if args.max_connections < 2:
        raise ValueError(f"--max-connections must be at least 2, got {args.max_connections}")
    config = decoding_config(args)
    logging.getLogger("goose.serve").setLevel(args.log_level.upper())
    if not _loopback(args.host) and args.api_key is None:
        print(f"goose serve: warning: listening on {args.host} without --api-key: anyone who can reach this "
              "machine can use the model", file=sys.stderr)
    model, tokenizer = load_model(args)
    name = args.served_model_name or args.model
    engine = Engine(model, tokenizer, config, max_queue=args.max_queue, max_batch=args.max_batch,
                    cache_positions=args.max_cache_tokens)
    origins = tuple(origin.rstrip("/").lower() for origin in args.cors_origin)  # as browsers write them
    app = create_app(engine, name, api_key=args.api_key, hosts=HostRule(args.host, args.allowed_host),
                     cors_origins=origins, body_timeout_s=args.body_timeout, docs=args.docs)
    print(f"goose serve: {name} ({weights(args)}, {args.device}), sources {','.join(config.sources)}, topology "
          f"{config.topology}, budget {config.budget}, up to {args.max_batch} requests together; warming up",
          file=sys.stderr)
    # h11 always (httptools, if installed, would bypass the header deadline), headers of 16 KiB at most
    server = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5,
                            http=guarded_protocol(args.header_timeout, args.body_timeout),
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES, limit_concurrency=args.max_connections)
    # uvicorn shuts down gracefully on SIGINT and SIGTERM, then raises the signal again under the handler
    # that was there before it: make that one end quietly too, so SIGTERM exits 0 like Ctrl-C
    previous = signal.signal(signal.SIGTERM, _stop_quietly)
    try:
        with contextlib.suppress(KeyboardInterrupt, _Stopped):
            EngineServer(server, engine).run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("goose serve: stopped", file=sys.stderr)
    return 0


class _Stopped(Exception):
    """SIGTERM, raised again by uvicorn after its graceful shutdown."""


def _stop_quietly(signum: int, frame: FrameType | None) -> None:
    raise _Stopped()


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@hookimpl
def goose_register_commands(register: Register) -> None:
    """`goose serve`, registered through goose's pyproject (entry point ``serve``) as any plugin's command is."""
    register("serve", add_arguments,
             description="serve the model over an OpenAI-compatible HTTP API (completions, chat, streaming)")
