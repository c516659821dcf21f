"""``goose datastore build|info``: build or describe a REST datastore (the rest source's command: its plugin
registers :func:`add_arguments` through ``goose_register_commands``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from goose.sources.rest.corpus import (
    DEFAULT_JSONL_FIELDS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_SUFFIXES,
    build,
    default_datastore,
    stdlib_files,
)
from goose.sources.rest.datastore import Datastore

logger = logging.getLogger("goose.datastore")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(title="actions", dest="action")
    make = actions.add_parser("build", help="tokenize files into a datastore for one model's tokenizer",
                              description="Tokenize text, code and JSONL files (or folders) into a datastore.")
    # only the tokenizer matters: a datastore serves every dtype and device of the model
    make.add_argument("--model", default="smollm2-135m",
                      help="whose tokenizer: smollm2-135m (default), gemma3-270m, a Hugging Face id or a local path")
    source = make.add_mutually_exclusive_group(required=True)
    source.add_argument("--from", dest="sources", nargs="+", metavar="PATH", help="files or folders to index")
    source.add_argument("--stdlib", action="store_true",
                        help="the default datastore: this Python's standard library (cached; --out optional)")
    make.add_argument("--out", type=Path, default=None, help="the datastore folder to write")
    make.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens")
    make.add_argument("--field", dest="fields", action="append", default=None, metavar="NAME",
                      help=f"JSONL string field to index (repeatable; default: {', '.join(DEFAULT_JSONL_FIELDS)})")
    make.add_argument("--ext", dest="suffixes", action="append", default=None, metavar=".EXT",
                      help="file suffix read when walking folders (repeatable; default: common text and code)")
    make.add_argument("--allow-benchmark-records", action="store_true",
                      help="index JSONL records that look like benchmark items (never do this for evaluation data)")
    make.add_argument("--force", action="store_true", help="replace an existing datastore at --out")
    make.set_defaults(run=_run_build)
    show = actions.add_parser("info", help="describe a datastore", description="Describe a datastore folder.")
    show.add_argument("path", type=Path)
    show.add_argument("--json", action="store_true")
    show.set_defaults(run=_run_info)
    parser.set_defaults(run=lambda _args: parser.print_help() or 2)


def _load_tokenizer(args: argparse.Namespace) -> Any:
    from goose import models

    logger.info("loading %s's tokenizer", args.model)
    return models.load_tokenizer(args.model)


def _run_build(args: argparse.Namespace) -> int:
    if args.max_tokens is not None and args.max_tokens <= 0:
        raise ValueError(f"--max-tokens must be positive, got {args.max_tokens}")
    if args.sources and args.out is None:
        raise ValueError("--out is required with --from")
    tokenizer = _load_tokenizer(args)
    started = time.perf_counter()
    if args.stdlib:
        if args.out is None:
            store = default_datastore(tokenizer, progress=True)
        else:
            store = build(tokenizer, stdlib_files(), args.out, max_tokens=args.max_tokens or DEFAULT_MAX_TOKENS,
                          suffixes=(".py",), overwrite=args.force, progress=True,
                          description=f"Python {sys.version.split()[0]} standard library")
    else:
        store = build(tokenizer, args.sources, args.out, max_tokens=args.max_tokens,
                      fields=tuple(args.fields or DEFAULT_JSONL_FIELDS),
                      suffixes=tuple(args.suffixes or DEFAULT_SUFFIXES),
                      allow_benchmark=args.allow_benchmark_records, overwrite=args.force, progress=True)
    print(f"datastore {store.path}: {store.manifest['documents']} documents, {len(store)} tokens "
          f"({_size(store.path) / 2**20:.1f} MiB) in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def _run_info(args: argparse.Namespace) -> int:
    store = Datastore.open(args.path)
    info = {"path": str(store.path), "size_bytes": _size(store.path), **store.manifest}
    if args.json:
        print(json.dumps(info))
        return 0
    tokenizer = info["tokenizer"]
    print(f"path:        {info['path']}  ({info['size_bytes'] / 2**20:.1f} MiB)")
    print(f"tokenizer:   {tokenizer['name']} (vocabulary {tokenizer['vocab_size']}, "
          f"fingerprint {tokenizer['fingerprint'][:16]})")
    print(f"content:     {info['documents']} documents, {info['suffixes']} tokens"
          + (f" (capped at {info['max_tokens']})" if info.get("truncated") else ""))
    if info.get("description"):
        print(f"description: {info['description']}")
    if info.get("sources"):
        more = info.get("sources_named", len(info["sources"])) - 3
        print(f"sources:     {info.get('files', '?')} files from {', '.join(info['sources'][:3])}"
              + (f" and {more} more" if more > 0 else ""))
    print(f"built:       {info.get('created', '?')} in {info.get('build_s', '?')} s "
          f"(suffix array: {info.get('suffix_array', '?')})")
    return 0


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
