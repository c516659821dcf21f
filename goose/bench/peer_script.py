"""A peer engine measured by a script of ours run under its own interpreter (vLLM, llama.cpp).

Each peer pins its own environment, so ``goose bench`` checks the interpreter and the script before
any model loads, runs the script after our methods, echoes its stdout as progress, keeps its stderr
in a log beside the results, and reads back the ``results.json`` it writes.
"""

from __future__ import annotations

import ast
import json
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import goose

STDERR_LINES_SHOWN = 15


class PeerBenchError(ValueError):
    """A peer's script failed; the message names the command and its last stderr lines."""


@dataclass(frozen=True)
class PeerScript:
    """How to run a peer's side: the interpreter, the script and its methods, all checked to exist."""

    python: str
    script: Path
    methods: tuple[str, ...]


def source_root() -> Path:
    """The checkout holding the ``goose`` package (and ``scripts/``)."""
    return Path(goose.__file__).resolve().parents[1]


def script_methods(script: Path) -> tuple[str, ...]:
    """The script's ``METHODS``, read from its source: importing it here would need the peer's environment."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "METHODS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise ValueError(f"{script} defines no METHODS")


def peer_files(flag: str, python: str, script_name: str, setup: str) -> tuple[str, Path]:
    """``flag``'s interpreter (absolute) and ``scripts/<script_name>``, or a ValueError naming what is missing."""
    script = source_root() / "scripts" / script_name
    if not script.is_file():
        raise ValueError(f"{flag} needs scripts/{script_name} from Goose's source checkout; not found at {script}")
    interpreter = shutil.which(python)
    if interpreter is None:
        raise ValueError(f"{flag} {python}: no such interpreter; give {setup}")
    return str(Path(interpreter).absolute()), script


def run_peer_script(command: Sequence[str], out: Path, *, name: str, log_name: str, env: Mapping[str, str],
                    error: type[PeerBenchError], progress: bool = True) -> dict[str, Any]:
    """Run ``command`` (a script writing ``results.json`` into ``out``), echo its stdout, return the results."""
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
