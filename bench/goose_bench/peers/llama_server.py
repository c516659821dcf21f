"""A llama.cpp server process of our own: started on a free local port, asked for greedy completions of token
ids, always stopped.

The llama.cpp runner's ``llama_server_ngram`` runs through it (the runner imports it from its own folder);
the standard library alone, so it runs in the llama.cpp environment as in goose's (and so it reads the CPU's
flags itself rather than through goose.cpu).

``make llama-server`` builds the binary for this CPU's instruction sets and records them in ``cpu-flags``
beside it (/proc/cpuinfo's names); a binary whose record names one this CPU lacks is refused before it
starts, in one line, where it would die with SIGILL. Without the record it starts as it is.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

HOST = "127.0.0.1"
STARTUP_S = 300.0  # loading the model and the server's own warm-up decode
REQUEST_S = 3600.0
STOP_S = 10.0
LOG_LINES_SHOWN = 15
CPUINFO = Path("/proc/cpuinfo")
CPU_FLAGS_FILE = "cpu-flags"  # beside the binary that `make llama-server` built (the link resolved)


class LlamaServerError(RuntimeError):
    """The server did not start, exited, or answered otherwise than asked; the message quotes its log's end."""


def free_port() -> int:
    """A port no one listens on now (the server binds it a moment later; a clash fails its start, loudly)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def missing_instructions(binary: str | Path, cpuinfo: Path | None = None) -> tuple[list[str], Path | None]:
    """The instruction sets that ``binary``'s build recorded (``cpu-flags`` beside it, the link resolved) and the
    CPU of ``cpuinfo`` (default :data:`CPUINFO`) lacks, and the record's path; ([], None) where there is no record."""
    record = Path(binary).resolve().parent / CPU_FLAGS_FILE
    try:
        required = record.read_text().split()
    except OSError:
        return [], None
    have: set[str] = set()
    try:
        for line in (cpuinfo or CPUINFO).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags":
                have = set(value.split())
                break
    except OSError:
        return [], record  # no cpuinfo to judge by: start it as it is
    return list(dict.fromkeys(flag for flag in required if flag not in have)), record


class LlamaServer:
    """``binary`` with ``arguments`` (the model, threads, speculative settings), its output into ``log``."""

    def __init__(self, binary: str | Path, arguments: Sequence[str], log: Path) -> None:
        self.command = [str(binary), *arguments]
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def __enter__(self) -> LlamaServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Start the process and wait until its /health answers 200 (503 while the model loads)."""
        missing, record = missing_instructions(self.command[0])
        if missing:  # it would die with SIGILL ("Illegal instruction") at the first of them
            raise LlamaServerError(f"{self.command[0]} was built for instructions this CPU lacks: {' '.join(missing)} "
                                   f"(recorded in {record}); `make llama-server` rebuilds it for this CPU")
        port = free_port()
        self.url = f"http://{HOST}:{port}"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            log.write(f"goose: {' '.join(self.command)} on port {port}\n".encode())
            log.flush()
            try:
                self.process = subprocess.Popen([*self.command, "--host", HOST, "--port", str(port)],
                                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            except OSError as error:
                raise LlamaServerError(f"{self.command[0]}: cannot start ({error.strerror}); "
                                       "`make llama-server` builds it") from error
        deadline = time.monotonic() + STARTUP_S
        while True:
            if self.process.poll() is not None:
                raise self._error(f"exited with status {self.process.returncode} before it was ready")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet, or 503 while loading
            if time.monotonic() > deadline:
                raise self._error(f"not ready after {STARTUP_S:.0f} s")
            time.sleep(0.05)

    def complete(self, ids: Sequence[int], max_tokens: int) -> tuple[list[int], float, float, tuple[int, int]]:
        """Greedy tokens after ``ids`` (no BOS added: a token-id prompt is taken as it is), up to ``max_tokens``
        or through the model's end-of-generation token (kept): (tokens, wall seconds from sending the request to
        its whole answer, the server's prompt time in seconds, (tokens drafted, accepted))."""
        body = {"prompt": list(ids), "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "repeat_penalty": 1.0,
                "seed": 0, "ignore_eos": False, "cache_prompt": False, "return_tokens": True, "stream": False}
        request = urllib.request.Request(f"{self.url}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_S) as answer:
                document: dict[str, Any] = json.loads(answer.read())
        except urllib.error.HTTPError as error:
            raise self._error(f"/completion answered {error.code}: {error.read()[:500]!r}") from error
        except (urllib.error.URLError, ConnectionError) as error:
            raise self._error(f"/completion failed: {error}") from error
        wall = time.perf_counter() - started
        timings = document.get("timings", {})
        if timings.get("cache_n", 0):  # cache_prompt off: the whole prompt is decoded every time
            raise self._error(f"reused {timings['cache_n']} cached prompt tokens")
        return ([int(t) for t in document["tokens"]], wall, timings.get("prompt_ms", 0.0) / 1000,
                (int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))))

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after STOP_S) and reap it; a no-op once stopped."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _error(self, what: str) -> LlamaServerError:
        lines = self.log.read_text(errors="replace").splitlines()[-LOG_LINES_SHOWN:] if self.log.is_file() else []
        return LlamaServerError(f"llama-server {what}; the end of its log ({self.log}):\n" + "\n".join(lines))
