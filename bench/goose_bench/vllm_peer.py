"""``goose bench vllm --python PATH``: vLLM measured in the same run, on the same prompts.

vLLM pins its own torch and transformers, so it runs in its own environment: after our methods,
:mod:`goose_bench.peers.vllm_runner` runs, by its path, under that environment's interpreter (where
goose and goose-vllm are installed too: vLLM loads the proposer by name) with the same datasets, limit,
max new tokens, dtype and concurrencies, and writes ``results.json`` into ``--out``'s ``vllm/``
folder. Each of its runs becomes a :class:`~goose_bench.concurrency.ConcurrencyRow` named
``vllm_<method>`` whose outputs are compared with OUR single-request AR outputs, prompt by prompt,
where both sides encoded the prompt to the same token ids.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import goose
import goose_bench
from goose_bench.concurrency import VLLM_PREFIX, ConcurrencyRow, latency_percentile
from goose_bench.medians import middle_by
from goose_bench.peer_script import PeerBenchError, PeerScript, peer_interpreter, peer_methods, run_peer_script
from goose_bench.peers import vllm_runner

DEFAULT_VLLM_METHODS = ("none", "ngram", "goose")
STDERR_LOG = "vllm_bench.stderr.log"  # vLLM logs a lot to stderr; kept for the error message and for reading


class VllmBenchError(PeerBenchError):
    """The vLLM runner failed; the message names the command and its last stderr lines."""


def vllm_peer(python: str, methods_text: str | None) -> PeerScript:
    """``goose bench vllm``'s ``--python`` and ``--vllm-methods`` checked before any model loads."""
    interpreter = peer_interpreter("--python", python, "the vLLM environment's python, e.g. "
                                   ".venv-vllm/bin/python (`make vllm-setup` builds it)")
    methods = peer_methods("--vllm-methods", methods_text, vllm_runner.METHODS) or DEFAULT_VLLM_METHODS
    if "none" not in methods:
        raise ValueError("--vllm-methods must keep none: the vLLM runner compares every output with it")
    return PeerScript(interpreter, Path(vllm_runner.__file__), methods)


def vllm_command(peer: PeerScript, model_path: str, datasets: Sequence[str], data_dir: Path, limit: int,
                 max_new_tokens: int, dtype: str, concurrencies: Sequence[int], out: Path) -> list[str]:
    return [peer.python, str(peer.script), "--model", model_path, "--datasets", ",".join(datasets),
            "--data-dir", str(data_dir), "--limit", str(limit), "--max-tokens", str(max_new_tokens),
            "--dtype", dtype, "--methods", ",".join(peer.methods),
            "--concurrency", ",".join(map(str, concurrencies)), "--out", str(out)]


def run_vllm_bench(command: Sequence[str], out: Path, progress: bool = True) -> dict[str, Any]:
    """Run ``command`` (a vLLM runner command writing into ``out``), echo its stdout, return its results.json."""
    # The runner imports goose_bench (the prompts) and vLLM's engine goose_vllm (the proposer) and goose: this
    # process's copies, the code whose rows they join, on PYTHONPATH through a folder holding links to those alone (to
    # goose_vllm where this process has it; else the vLLM environment's own). Not the folders they lie in: from a wheel
    # that is a site-packages whose torch and transformers would shadow the versions vLLM pins.
    proposer = importlib.util.find_spec("goose_vllm")
    folders = {package.__name__: Path(package.__file__).resolve().parent for package in (goose, goose_bench)}
    if proposer is not None and proposer.origin:
        folders["goose_vllm"] = Path(proposer.origin).resolve().parent
    with tempfile.TemporaryDirectory(prefix="goose-for-vllm-") as alone:
        for name, folder in folders.items():
            (Path(alone) / name).symlink_to(folder, target_is_directory=True)
        path = os.pathsep.join(part for part in (alone, os.environ.get("PYTHONPATH")) if part)
        # vLLM logs to stdout by default; to stderr (the log file) instead, so that stdout is the runner's progress
        env = {"VLLM_LOGGING_STREAM": "ext://sys.stderr", **os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
        return run_peer_script(command, out, name="vllm", log_name=STDERR_LOG, env=env, error=VllmBenchError,
                               progress=progress)


def vllm_rows(results: dict[str, Any], model: str, prompt_ids: Sequence[list[int]],
              reference_outputs: Sequence[list[int]]) -> tuple[list[ConcurrencyRow], list[str]]:
    """The vLLM runner's ``results`` as rows ``vllm_<method>`` per concurrency, and notes for the report.

    A prompt counts towards ``identical_to_ar`` only where vLLM's side encoded it to our token ids;
    the notes say which did not. Latency is known one request at a time only (at higher concurrency
    the runner submits every prompt at once). With several rounds (``--repeat``), the one with the
    median tok/s, as the runner's own report takes.
    """
    theirs = results["prompts"]
    notes = []
    if len(theirs) != len(prompt_ids):
        comparable: list[int] = []
        notes.append(f"- vLLM decoded {len(theirs)} prompts, we decoded {len(prompt_ids)}: its outputs are not "
                     f"compared with ours")
    else:
        comparable = [i for i, prompt in enumerate(theirs) if prompt["ids"] == list(prompt_ids[i])]
        differ = [f"{prompt['dataset']}/{prompt['question_id']}"
                  for prompt, ours in zip(theirs, prompt_ids, strict=True) if prompt["ids"] != list(ours)]
        if differ:
            notes.append(f"- vLLM's side encoded {len(differ)} of {len(theirs)} prompts to other token ids "
                         f"({', '.join(differ)}): identical to AR counts the other {len(comparable)}")
    rounds: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in results["runs"]:
        rounds.setdefault((run["method"], run["concurrency"]), []).append(run)
    rows = []
    for (method, concurrency), found in rounds.items():
        run = middle_by(found, key=lambda r: r["tokens_per_s"])
        outputs = run["outputs"]
        same = sum(outputs[i] == list(reference_outputs[i]) for i in comparable)
        seconds = [s for s in run["seconds"] if s is not None]
        rows.append(ConcurrencyRow(
            model, VLLM_PREFIX + method, concurrency, len(outputs), sum(len(o) for o in outputs),
            round(run["wall_s"], 3), round(run["tokens_per_s"], 2),
            latency_percentile(seconds, 50), latency_percentile(seconds, 95), round(run["tau"], 3),
            round(same / len(comparable), 3) if comparable else None))
    return rows, notes

