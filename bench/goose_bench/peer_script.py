"""A peer engine measured by a runner of ours run under its own interpreter (vLLM, llama.cpp).

Each peer pins its own environment, so ``goose bench`` checks the interpreter before any model
loads, runs the runner (a module of :mod:`goose_bench.peers`, run by its path as a script: it ships
in the wheel) after our methods, echoes its stdout as progress, keeps its stderr in a log beside the
results, and reads back the ``results.json`` it writes.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STDERR_LINES_SHOWN = 15


class PeerBenchError(ValueError):
    """A peer's runner failed; the message names the command and its last stderr lines."""


@dataclass(frozen=True)
class PeerScript:
    """How to run a peer's side: the interpreter (checked to exist), the runner file and its methods."""

    python: str
    script: Path
    methods: tuple[str, ...]


def peer_interpreter(flag: str, python: str, setup: str) -> str:
    """``flag``'s interpreter as an absolute path, or a ValueError saying how to get one."""
    interpreter = shutil.which(python)
    if interpreter is None:
        raise ValueError(f"{flag} {python}: no such interpreter; give {setup}")
    return str(Path(interpreter).absolute())


def peer_methods(flag: str, text: str | None, known: Sequence[str]) -> tuple[str, ...]:
    """A peer's ``--*-methods`` list (comma-separated): the names given, once each, in order; every one its
    runner's. Empty where none is given (the caller's default then)."""
    named = tuple(dict.fromkeys(part.strip() for part in (text or "").split(",") if part.strip()))
    unknown = [method for method in named if method not in known]
    if unknown:
        raise ValueError(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return named


def run_peer_script(command: Sequence[str], out: Path, *, name: str, log_name: str, env: Mapping[str, str],
                    error: type[PeerBenchError], progress: bool = True) -> dict[str, Any]:
    """Run ``command`` (a runner writing ``results.json`` into ``out``), echo its stdout, return the results."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / log_name
    with log.open("w") as stderr, subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=stderr, text=True,
                                                  env=dict(env)) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if progress:
                print(f"  {name} | {line.rstrip()}", flush=True)
    if process.returncode != 0:
        last = log.read_text(errors="replace").splitlines()[-STDERR_LINES_SHOWN:]
        raise error(f"the {name} benchmark failed (exit status {process.returncode}): {shlex.join(command)}\n"
                    f"its last stderr lines (all of them in {log}):\n" + "\n".join(last))
    return json.loads((out / "results.json").read_text())
