"""``goose bench llama --python PATH``: llama.cpp measured in the same run, on the same prompts.

llama-cpp-python is compiled from source into its own environment (``make llama-setup``), so it
runs in another interpreter: :mod:`goose_bench.peers.llama_runner` runs there, by its path, on the
GGUF file the model ships as (:func:`goose.models.gguf_path`), with the token ids our run encoded
for each sample's first turn, our EOS ids, the same max new tokens, threads and repeats. It takes
turns with our methods (:class:`LlamaAlongside`): loaded once per model, it runs each sample's turn
between our methods' runs of that sample, before them and after them in turn, so that a VM whose
speed drifts over minutes moves both sides alike (run after ours, minutes later, our plain decoding
and llama.cpp's, the same work, differed by up to 8%). Its methods
(``llama``: greedy; ``llama_pld``: llama-cpp-python's prompt lookup drafting; ``llama_server_ngram``:
llama.cpp's server with ``--spec-type ngram-mod``, where ``make llama-server`` has built it) become
the summary's ``llama`` section: tokens per second per prompt beside our methods' on the same first
turn, the ratio of ours over each, how many of its texts equal ours and ``llama``'s, and the
server's drafted and accepted tokens.

The two sides do not decode the same weights: llama.cpp runs the quantized GGUF (Q4_K_M, Q4_1)
through its quantized kernels, ours the dequantized weights in ``--dtype`` (with ``--quantize int8``:
int8 weights of our own). So its texts may differ from ours, and per token it reads a fraction of the
bytes we read; the section says both.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm

from goose.store.cache_dir import default_cache_dir
from goose_bench.medians import median_of
from goose_bench.peer_script import (
    PeerBenchError,
    PeerScript,
    PeerSession,
    peer_folder,
    peer_interpreter,
    peer_methods,
)
from goose_bench.peers import llama_runner
from goose_bench.prompts import Sample
from goose_bench.records import Record

STDERR_LOG = "llama_bench.stderr.log"
PROMPTS_FILE = "prompts.json"
PLAIN, SERVER_NGRAM = llama_runner.PLAIN, llama_runner.SERVER_NGRAM
SERVER_TARGET = "make llama-server"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}


class LlamaBenchError(PeerBenchError):
    """The llama.cpp runner failed; the message names the command and its last stderr lines."""


def llama_server_binary() -> Path:
    """Where ``make llama-server`` links the llama-server binary it built for the current version and flags."""
    return default_cache_dir() / "bin" / "llama-server"


def llama_peer(python: str, model_names: Sequence[str], methods_text: str | None = None) -> PeerScript:
    """``goose bench llama``'s ``--python`` and ``--llama-methods`` checked before any model loads: the interpreter,
    a GGUF file per model, the methods; ``llama_server_ngram`` needs the llama-server binary: an error where it is
    named, left out with a notice where it is only a default."""
    from goose.models import has_gguf

    interpreter = peer_interpreter("--python", python, "the llama.cpp environment's python, e.g. "
                                   ".venv/bin/python (`make llama-setup` builds it)")
    no_file = [name for name in model_names if not has_gguf(name)]
    if no_file:
        raise ValueError(f"goose bench llama: llama.cpp reads GGUF files; {', '.join(no_file)} has none (an embedded "
                         f"model or a .gguf path has one)")
    named = peer_methods("--llama-methods", methods_text, llama_runner.METHODS)
    methods = named or llama_runner.METHODS
    if SERVER_NGRAM in methods and not llama_server_binary().is_file():
        if named:
            raise ValueError(f"--llama-methods {SERVER_NGRAM}: no llama-server at {llama_server_binary()}; "
                             f"`{SERVER_TARGET}` builds it")
        print(f"llama.cpp: {SERVER_NGRAM} left out: no llama-server at {llama_server_binary()} (`{SERVER_TARGET}` "
              "builds it)", file=sys.stderr, flush=True)
        methods = tuple(method for method in methods if method != SERVER_NGRAM)
    return PeerScript(interpreter, Path(llama_runner.__file__), methods)


def prompts_document(samples: Sequence[Sample], first_turn_ids: Sequence[list[int]], eos_ids: Sequence[int]
                     ) -> dict[str, Any]:
    """What the llama.cpp runner reads: every sample's first-turn token ids as our run encoded them, and our EOS ids."""
    return {"eos_ids": list(eos_ids),
            "prompts": [{"dataset": sample.dataset, "question_id": sample.question_id, "ids": list(ids)}
                        for sample, ids in zip(samples, first_turn_ids, strict=True)]}


def llama_command(peer: PeerScript, gguf: Path, prompts_file: Path, max_new_tokens: int, threads: int,
                  repeats: int, out: Path, engine: str = "torch") -> list[str]:
    """The runner's command; beside ``--engine llama.cpp`` its Llama objects take the engine's attention settings
    (and inherit its ggml switches from this process's environment), so ``llama`` decodes as our ``ar`` does."""
    return [peer.python, str(peer.script), "--gguf", str(gguf), "--prompts", str(prompts_file),
            "--max-tokens", str(max_new_tokens), "--methods", ",".join(peer.methods), "--threads", str(threads),
            "--repeats", str(repeats), "--out", str(out), *(["--engine-attention"] if engine == "llama.cpp" else []),
            *(["--server", str(llama_server_binary())] if SERVER_NGRAM in peer.methods else [])]


def _first_turn_speed(record: Record) -> float | None:
    """Our tokens per second on a record's first turn (llama.cpp decodes first turns only)."""
    choice = record["choices"][0]
    tokens, seconds = choice["new_tokens"][0], choice["wall_time"][0]
    return tokens / seconds if seconds > 0 else None


def _after_first(tokens: int, seconds: float, first: float | None) -> float | None:
    """Tokens per second of the decoding after the first token (the prefill and its token excluded)."""
    if first is None or tokens < 2 or seconds <= first:
        return None
    return (tokens - 1) / (seconds - first)


def _first_turn_timing(record: Record) -> tuple[float | None, float | None]:
    """Our (seconds to the first token, decoding tok/s after it) on a record's first turn."""
    choice = record["choices"][0]
    first = record.get("first_token_s")
    return first, _after_first(choice["new_tokens"][0], choice["wall_time"][0], first)


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours and theirs else None


def _median(values: Sequence[float | None]) -> float | None:
    found = median_of(values)
    return round(found, 3) if found is not None else None


def llama_section(results: dict[str, Any], records: Sequence[Record], dtype: str, quantize: str | None = None
                  ) -> dict[str, Any]:
    """The llama.cpp runner's ``results`` beside our ``records`` of the same model: the summary's ``llama`` section.

    Per prompt (a sample's first turn): every method's tokens per second, ours over each of
    llama.cpp's (ours: ``goose`` where it ran, else ``ar``), whether each llama.cpp text equals
    our ``ar`` text and each drafting method's equals ``llama``'s, and the server's draft counts.
    Then the medians, counts and sums over prompts.
    """
    ours: dict[tuple[str, Any], dict[str, Record]] = {}
    for record in records:
        ours.setdefault((record["dataset"], record["question_id"]), {})[record["method"]] = record
    our_methods = list(dict.fromkeys(record["method"] for record in records))
    reference = "goose" if "goose" in our_methods else "ar"
    theirs: dict[int, dict[str, dict[str, Any]]] = {}
    for generation in results["generations"]:
        theirs.setdefault(generation["prompt"], {})[generation["method"]] = generation
    llama_methods = list(results["methods"])
    rows = []
    for index, prompt in enumerate(results["prompts"]):
        mine = ours.get((prompt["dataset"], prompt["question_id"]))
        if mine is None or index not in theirs:  # a sample our run skipped (too long for the model)
            continue
        speed = {method: _first_turn_speed(record) for method, record in mine.items()}
        speed |= {method: generation["tokens_per_s"] for method, generation in theirs[index].items()}
        timing = {method: _first_turn_timing(record) for method, record in mine.items()}
        timing |= {method: (g.get("first_token_s"), _after_first(len(g["output"]), g.get("wall_s") or 0.0,
                                                                 g.get("first_token_s")))
                   for method, g in theirs[index].items()}
        ar_ids = mine["ar"]["new_token_ids"][0] if "ar" in mine else None
        outputs = {method: generation["output"] for method, generation in theirs[index].items()}
        rows.append({
            "dataset": prompt["dataset"],
            "question_id": prompt["question_id"],
            "prompt_tokens": len(prompt["ids"]),
            "new_tokens": {method: len(record["new_token_ids"][0]) for method, record in mine.items()}
            | {method: len(output) for method, output in outputs.items()},
            "tokens_per_s": speed,
            "ratios": {f"{reference}/{method}": _ratio(speed.get(reference), speed.get(method))
                       for method in llama_methods},
            # the decoding after the first token, and the first token's wait, apart (prefill is the same work)
            "first_token_s": {method: first for method, (first, _) in timing.items()},
            "decode_tokens_per_s": {method: after for method, (_, after) in timing.items()},
            "decode_ratios": {f"{reference}/{method}": _ratio(timing[reference][1], timing[method][1])
                              for method in llama_methods},
            "first_token_ratios": {f"{reference}/{method}": _ratio(timing[reference][0], timing[method][0])
                                   for method in llama_methods},
            "identical_to_ar": {method: output == ar_ids for method, output in outputs.items()},
            "identical_to_plain": {method: output == outputs[PLAIN] for method, output in outputs.items()
                                   if method != PLAIN and PLAIN in outputs},
            "drafts": {method: {"drafted": generation["drafted"], "accepted": generation["accepted"]}
                       for method, generation in theirs[index].items() if generation.get("drafted") is not None},
        })
    conditions = results["conditions"]
    our_bytes = conditions["n_params"] * DTYPE_BYTES[quantize or dtype] if (quantize or dtype) in DTYPE_BYTES \
        else conditions["gguf_bytes"]  # the embedding table is a lookup; the llama.cpp engine reads the file
    return {
        "conditions": conditions,
        "turns": "the first turn of every sample",
        "reference": reference,
        "our_methods": our_methods,
        "llama_methods": llama_methods,
        # weights read per token (every weight once): the GGUF file against its parameters in our dtype (or int8)
        "weight_bytes_ratio": round(conditions["gguf_bytes"] / our_bytes, 3),
        "prompts": rows,
        "median_tokens_per_s": {method: _median([row["tokens_per_s"].get(method) for row in rows])
                                for method in [*our_methods, *llama_methods]},
        "median_ratios": {f"{reference}/{method}": _median([row["ratios"][f"{reference}/{method}"] for row in rows])
                          for method in llama_methods},
        **{f"median_{key}": {ratio: _median([row[key][ratio] for row in rows]) for ratio in
                             (f"{reference}/{method}" for method in llama_methods)}
           for key in ("decode_ratios", "first_token_ratios")},
        "identical_to_ar": {method: sum(row["identical_to_ar"][method] for row in rows) for method in llama_methods},
        "identical_to_plain": {method: sum(row["identical_to_plain"][method] for row in rows)
                               for method in llama_methods if method != PLAIN and PLAIN in llama_methods},
        "drafts": {method: {key: sum(row["drafts"][method][key] for row in rows if method in row["drafts"])
                            for key in ("drafted", "accepted")}
                   for method in llama_methods if any(method in row["drafts"] for row in rows)},
        "compared": len(rows),
    }


def across_files(sections: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Several GGUF files in one run (``--model A.gguf,B.gguf``), their ``llama`` sections in ``--model`` order: per
    file our reference method's and llama.cpp plain decoding's median tok/s, and each over the first file's plain
    decoding on the same prompt (median over the prompts both ran), whole and after the first token. None with
    fewer than two files or without plain decoding."""
    if len(sections) < 2 or not all(PLAIN in section["llama_methods"] for section in sections.values()):
        return None
    first = next(iter(sections.values()))

    def speeds(section: dict[str, Any], key: str) -> dict[tuple[str, Any], dict[str, float | None]]:
        return {(row["dataset"], row["question_id"]): row[key] for row in section["prompts"]}

    yardstick = {key: speeds(first, key) for key in ("tokens_per_s", "decode_tokens_per_s")}
    files = []
    for model, section in sections.items():
        methods = (section["reference"], PLAIN)
        over = {key: {method: _median([_ratio(row.get(method), yardstick[key][prompt].get(PLAIN))
                                       for prompt, row in speeds(section, key).items() if prompt in yardstick[key]])
                      for method in methods}
                for key in yardstick}
        files.append({"model": model, "gguf": section["conditions"]["gguf"],
                      "gguf_bytes": section["conditions"]["gguf_bytes"], "reference": section["reference"],
                      "median_tokens_per_s": {method: section["median_tokens_per_s"].get(method) for method in methods},
                      "over_first_plain": over["tokens_per_s"],
                      "over_first_plain_after_first": over["decode_tokens_per_s"]})
    return {"first": next(iter(sections)), "plain": PLAIN, "files": files}


class LlamaAlongside:
    """llama.cpp taking turns with our methods, model by model (:class:`goose_bench.runner.Alongside`): a runner
    started once our side has encoded a model's first turns (written to ``prompts.json``: every sample's), handed
    each sample's turn by the bench, and its results joined to our records as that model's ``llama`` section
    (``sections``) when the model is done. A runner that fails is stopped and its error kept (``failure``, raised by
    ``goose bench`` once our methods are done): our methods go on without it."""

    def __init__(self, peer: PeerScript, out: Path, several_models: bool, dtype: str, quantize: str | None,
                 max_new_tokens: int, threads: int, repeats: int, progress: bool = True, engine: str = "torch"
                 ) -> None:
        self.peer, self.out, self.several_models = peer, out, several_models
        self.dtype, self.quantize, self.engine, self.progress = dtype, quantize, engine, progress
        self.max_new_tokens, self.threads, self.repeats = max_new_tokens, threads, repeats
        self.sections: dict[str, dict[str, Any]] = {}
        self.failure: LlamaBenchError | None = None
        self.session: PeerSession | None = None

    def begin(self, model: str, samples: Sequence[Sample], first_turn_ids: Sequence[list[int]],
              eos_ids: Sequence[int]) -> None:
        from goose.models import gguf_path

        folder = peer_folder(self.out, "llama", model, self.several_models)
        folder.mkdir(parents=True, exist_ok=True)
        prompts_file = folder / PROMPTS_FILE
        prompts_file.write_text(json.dumps(prompts_document(samples, first_turn_ids, eos_ids)) + "\n")
        command = [*llama_command(self.peer, gguf_path(model), prompts_file, self.max_new_tokens, self.threads,
                                  self.repeats, folder, self.engine), "--turns"]
        tqdm.write(f"{model}: llama.cpp {', '.join(self.peer.methods)} on {len(samples)} first turns, in turns with "
                   f"ours ({self.peer.script.name}, into {folder})", file=sys.stdout)
        with self._kept_going():
            self.session = start_llama_session(command, folder, self.progress)

    def turn(self, index: int, repeat: int) -> None:
        if self.session is not None:
            with self._kept_going():
                self.session.turn(f"{index} {repeat}")

    def end(self, model: str, records: Sequence[Record], finished: bool) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        if not finished:
            session.stop()
            return
        with self._kept_going():
            section = llama_section(session.finish(), records, self.dtype, self.quantize)
            self.sections[model] = section | {"engine": self.engine}

    @contextmanager
    def _kept_going(self) -> Iterator[None]:
        """A runner that fails (its session already stopped) is said once and kept as ``failure``; ours go on."""
        try:
            yield
        except LlamaBenchError as error:
            self.session = None
            self.failure = self.failure or error
            tqdm.write(f"llama.cpp stopped; our methods go on without it: {error}", file=sys.stderr)


def start_llama_session(command: Sequence[str], out: Path, progress: bool = True) -> PeerSession:
    """The llama.cpp runner's ``command`` (with ``--turns``) started and warm, writing into ``out``."""
    return PeerSession(command, out, name="llama", log_name=STDERR_LOG, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                       error=LlamaBenchError, ready=llama_runner.READY, done=llama_runner.DONE, progress=progress)
