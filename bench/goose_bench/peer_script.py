"""A peer engine measured by a runner of ours run under its own interpreter (vLLM, llama.cpp).

Each peer pins its own environment, so ``goose bench`` checks the interpreter before any model
loads, runs the runner (a module of :mod:`goose_bench.peers`, run by its path as a script: it ships
in the wheel), echoes its stdout as progress, keeps its stderr in a log beside the results, and reads
back the ``results.json`` it writes: after our methods (:func:`run_peer_script`), or kept alive beside
them and handed one turn at a time (:class:`PeerSession`), so that both sides are timed in the same
minutes.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

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


def peer_folder(out: Path, peer: str, model: str, several_models: bool) -> Path:
    """Where a peer's files go: ``out/PEER``, or ``out/PEER/MODEL`` (the model's name or path as one folder name)
    where the run has several models."""
    if not several_models:
        return out / peer
    return out / peer / "".join(c if c.isalnum() or c in "-_." else "_" for c in model.strip("/"))


def run_peer_script(command: Sequence[str], out: Path, *, name: str, log_name: str, env: Mapping[str, str],
                    error: type[PeerBenchError], progress: bool = True) -> dict[str, Any]:
    """Run ``command`` (a runner writing ``results.json`` into ``out``) to its end, echo its stdout, return the
    results: a :class:`PeerSession` handed no turn."""
    return PeerSession(command, out, name=name, log_name=log_name, env=env, error=error, progress=progress).finish()


def _failure(command: Sequence[str], status: int, log: Path, name: str, error: type[PeerBenchError]
             ) -> PeerBenchError:
    last = log.read_text(errors="replace").splitlines()[-STDERR_LINES_SHOWN:]
    return error(f"the {name} benchmark failed (exit status {status}): {shlex.join(command)}\n"
                 f"its last stderr lines (all of them in {log}):\n" + "\n".join(last))


class PeerSession:
    """A runner kept alive beside our run and handed one turn at a time: ``command`` prints ``ready`` once loaded
    and warm, then runs each stdin line it is given and prints ``done`` and the line after it; at the end of its
    stdin it writes ``results.json`` into ``out`` and exits. Starting returns once it is ready (its loading overlaps
    none of our timed work; ``ready`` None: at once, for a runner that takes no turns); every other stdout line is
    echoed as progress; a runner that exits early, or not cleanly, is an ``error`` naming the command and its last
    stderr lines."""

    def __init__(self, command: Sequence[str], out: Path, *, name: str, log_name: str, env: Mapping[str, str],
                 error: type[PeerBenchError], ready: str | None = None, done: str = "", progress: bool = True
                 ) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.command, self.out, self.name, self.error, self.done, self.progress = \
            list(command), out, name, error, done, progress
        self.log = out / log_name
        self._stderr = self.log.open("w")
        self.process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._stderr, text=True, env=dict(env))
        if ready is not None:
            self._guarded(ready)

    def turn(self, line: str) -> None:
        """Hand the runner ``line`` and wait until it says that turn is done."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it exited: reading its stdout to the end says how
        self._guarded(f"{self.done} {line}")

    def finish(self) -> dict[str, Any]:
        """End the runner's stdin, wait for it to write its results, and return them."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self._guarded(None)
        return json.loads((self.out / "results.json").read_text())

    def stop(self) -> None:
        """Kill the runner where it still runs (our run stopped or failed); its log is kept."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self._stderr):
            if stream is not None:
                stream.close()

    def _guarded(self, marker: str | None) -> None:
        """:meth:`_echo_until`; interrupted or failed, it leaves no runner behind."""
        try:
            self._echo_until(marker)
        except BaseException:
            self.stop()
            raise

    def _echo_until(self, marker: str | None) -> None:
        """Echo the runner's stdout up to the line ``marker``; ``None``: to its end, where it must exit cleanly."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if marker is not None and line.rstrip("\n") == marker:
                return
            if self.progress:
                # beside our run's progress bar: written above it, not through it
                tqdm.write(f"  {self.name} | {line.rstrip()}", file=sys.stdout)
        status = self.process.wait()
        self.process.stdout.close()
        self._stderr.close()
        if marker is not None or status != 0:
            raise _failure(self.command, status, self.log, self.name, self.error)
