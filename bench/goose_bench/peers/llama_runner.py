"""llama.cpp on Goose's benchmark prompts: plain greedy decoding, its prompt lookup and its server's ngram-mod.

Run with the llama.cpp environment (``make llama-setup`` builds it); ``goose bench llama --python
.venv/bin/python`` runs it beside its own methods, on the same prompts, taking turns with them::

    .venv/bin/python bench/goose_bench/peers/llama_runner.py --gguf FILE.gguf --prompts prompts.json --out DIR

Alone it runs every prompt, ``--repeats`` times, and exits. With ``--turns`` it loads, warms up,
prints ``@ready`` and then runs one turn per line of stdin, ``INDEX REPEAT``: every method once on
that prompt, then ``@done INDEX REPEAT``; at the end of stdin it writes results.json. ``goose bench``
hands it each prompt between its own methods' runs of that prompt, so the two sides are timed
minutes apart no more: a VM's clock drifts by more than the ratios they are compared by.

``--prompts`` is a JSON object ``{"eos_ids": [...], "prompts": [{"dataset", "question_id", "ids"}, ...]}``:
the token ids Goose's side encoded (chat template applied there), so that both engines decode the
same input, and the token ids Goose stops at. Nothing of Goose is imported here: the environment
need hold llama-cpp-python only.

Methods, over the same GGUF file (the file as shipped: its quantized weights run through llama.cpp's
quantized kernels):

- ``llama``: a ``Llama`` decoding greedily, one token per ``llama_decode``;
- ``llama_pld``: the same with llama-cpp-python's ``LlamaPromptLookupDecoding`` as ``draft_model``
  (n-gram lookup in the prompt and the output so far, ``--num-pred-tokens`` drafted tokens, checked
  in one batch);
- ``llama_server_ngram``: llama.cpp's own server (``--server``, the binary ``make llama-server``
  builds from the same version's sources) with ``--spec-type ngram-mod`` and the settings llama.cpp's
  docs/speculative.md gives for it (``--spec-ngram-mod-n-match 24 --spec-ngram-mod-n-min 48
  --spec-ngram-mod-n-max 64``, also its defaults): a rolling hash of the last 24 tokens looked up in a
  pool filled from the prompt and the output, a draft kept when it reaches 48 tokens. One slot, greedy
  (temperature 0, top_k 1), the prompt as token ids, ``cache_prompt`` off. The pool is shared by all
  the server's requests, so each run gets a server of its own (its start is not timed): a prompt's
  drafts come from that prompt alone, as ``llama_pld``'s do. Its stats (tokens drafted and accepted)
  are kept per run.

One request at a time: llama-cpp-python's ``Llama`` decodes one sequence (its ``generate`` has no
batch of requests). Every run starts from an empty KV cache (no prefix reuse across prompts or
repeats), and the clock covers the call from the prompt's ids to the last new token, prefill
included, as Goose's bench times its own methods (the server's: from sending the request to its
whole answer). Writes ``results.json`` into ``--out``.

Before it imports ``llama_cpp`` it checks the instruction sets the installed build recorded
(``goose-llama-cpu-flags`` in this environment, or ``$GOOSE_LLAMA_CPU_FLAGS``: what ``make
llama-setup`` writes and goose.llama_model reads) against /proc/cpuinfo's flags, as llama_server.py
checks the server's build: a build for another CPU is refused in one line on stderr (exit status 3)
where loading it would die with SIGILL.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PLAIN, LOOKUP, SERVER_NGRAM = "llama", "llama_pld", "llama_server_ngram"
METHODS = (PLAIN, LOOKUP, SERVER_NGRAM)
GGML_TYPE_BF16 = 30  # ggml.h's enum ggml_type
WARMUP_TOKENS = 8
# llama.cpp's docs/speculative.md for ngram-mod (its defaults too): lookup length, shortest and longest draft
NGRAM_MOD = {"n_match": 24, "n_min": 48, "n_max": 64}
SERVER_LOG = "llama_server.log"
READY, DONE = "@ready", "@done"  # --turns: stdout's lines that say it is ready for a turn, and that one is done
CPUINFO = Path("/proc/cpuinfo")
# where `make llama-setup` records the instruction sets of the llama-cpp-python it installed (goose.llama_model's)
CPU_FLAGS_VARIABLE = "GOOSE_LLAMA_CPU_FLAGS"
CPU_FLAGS_FILE = "goose-llama-cpu-flags"
REFUSED_STATUS = 3


@dataclass
class Generation:
    """One method on one prompt: the median of its repeats by wall time, and every repeat's time."""

    method: str
    prompt: int  # index into the prompts
    output: list[int]
    wall_s: float
    first_token_s: float
    wall_s_runs: list[float]
    repeats_identical: bool
    tstamp: float  # the kept run's end, in seconds since the epoch (as goose bench's records' tstamp)
    drafted: int | None = None  # llama_server_ngram: tokens drafted and accepted in the kept run (the server's count)
    accepted: int | None = None

    @property
    def tokens_per_s(self) -> float:
        return len(self.output) / self.wall_s if self.wall_s > 0 else 0.0


def _cpu_count() -> int:
    """The CPUs this process may run on (its affinity: a container's or taskset's share), as goose's
    ``goose.planning.machine.cpu_count``; this runner runs by its path in a peer's environment, without goose."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", required=True, help="the GGUF file to decode")
    parser.add_argument("--prompts", required=True, help="JSON file: eos_ids and prompts' token ids")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt at most")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {', '.join(METHODS)}")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp's n_threads (default: the CPU count)")
    parser.add_argument("--num-pred-tokens", type=int, default=10, help="llama_pld: tokens drafted per lookup")
    parser.add_argument("--max-ngram-size", type=int, default=2, help="llama_pld: longest n-gram looked up")
    parser.add_argument("--server", default=None, help=f"{SERVER_NGRAM}: the llama-server binary")
    parser.add_argument("--engine-attention", action="store_true", help="flash attention with a bfloat16 V cache, as "
                        "goose's llama.cpp engine runs (llama-cpp-python's Llama: flash attention off, float16 V)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every method on every prompt; the median "
                        "by wall time is kept")
    parser.add_argument("--out", required=True, help="folder for results.json")
    parser.add_argument("--turns", action="store_true", help=f"print {READY} once warm, then run one turn per stdin "
                        f"line 'INDEX REPEAT' (every method once on that prompt; {DONE} INDEX REPEAT after it) until "
                        "stdin ends")
    args = parser.parse_args(argv)
    args.methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown or not args.methods:
        parser.error(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    for flag in ("max_tokens", "num_pred_tokens", "max_ngram_size", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if not Path(args.gguf).is_file():
        parser.error(f"--gguf {args.gguf}: no such file")
    if SERVER_NGRAM in args.methods and (args.server is None or not Path(args.server).is_file()):
        parser.error(f"{SERVER_NGRAM} needs --server, the llama-server binary (`make llama-server` builds it); "
                     f"got {args.server}")
    return args


def context_length(prompts: list[dict[str, Any]], max_tokens: int, drafted: int) -> int:
    """Room for the longest prompt, its output and one batch of drafts past the end, in whole 256s."""
    needed = max(len(p["ids"]) for p in prompts) + max_tokens + drafted + 1
    return -(-needed // 256) * 256


def server_arguments(args: argparse.Namespace, n_ctx: int, threads: int) -> list[str]:
    """llama-server's flags: ``build``'s ``Llama`` settings (context, batch, threads, attention) and ngram-mod."""
    attention = ["-fa", "on", "-ctv", "bf16"] if args.engine_attention else ["-fa", "off"]
    return ["-m", args.gguf, "-c", str(n_ctx), "-b", str(n_ctx), "-t", str(threads), "-tb", str(threads),
            "--parallel", "1", "--cache-ram", "0", "--seed", "0", *attention, "--spec-type", "ngram-mod",
            *(item for key, value in NGRAM_MOD.items() for item in (f"--spec-ngram-mod-{key.replace('_', '-')}",
                                                                     str(value)))]


def cpu_flags_file() -> Path:
    """The installed llama-cpp-python's record of the instruction sets it needs: ``$GOOSE_LLAMA_CPU_FLAGS``, else
    ``goose-llama-cpu-flags`` in this interpreter's environment (as goose.llama_model.cpu_flags_file)."""
    return Path(os.environ.get(CPU_FLAGS_VARIABLE) or Path(sys.prefix) / CPU_FLAGS_FILE)


def llama_cpp_refusal(record: Path | None = None, cpuinfo: Path | None = None) -> str | None:
    """One line where the build recorded at ``record`` (default :func:`cpu_flags_file`) needs instructions that the
    CPU of ``cpuinfo`` (default :data:`CPUINFO`) lacks (its first ``flags`` line); None where it has them all, or
    where there is no record or no cpuinfo to judge by. goose.cpu.refusal's check in the standard library, reading
    the flags as llama_server.missing_instructions does (which reads the record beside the server's binary)."""
    record = record or cpu_flags_file()
    try:
        required = record.read_text().split()
        lines = (cpuinfo or CPUINFO).read_text(errors="replace").splitlines()
    except OSError:
        return None
    have = next((set(value.split()) for key, _, value in (line.partition(":") for line in lines)
                 if key.strip() == "flags"), set())
    missing = list(dict.fromkeys(flag for flag in required if flag not in have))
    if not missing:
        return None
    return (f"llama-cpp-python was built for instructions this CPU lacks: {' '.join(missing)} (recorded in {record}); "
            "`make llama-setup` rebuilds it for this CPU")


def build(method: str, args: argparse.Namespace, n_ctx: int) -> Any:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = (LlamaPromptLookupDecoding(max_ngram_size=args.max_ngram_size, num_pred_tokens=args.num_pred_tokens)
             if method == "llama_pld" else None)
    threads = args.threads or _cpu_count()
    # seed: greedy decoding draws nothing, but the value is pinned anyway
    # n_batch = n_ctx: with a draft model llama-cpp-python keeps every position's logits, in an array it sizes
    # by n_batch (its own logits_all argument, not the draft's), so a sequence past n_batch (512 by default)
    # would overflow it (`could not broadcast ... into shape`)
    return Llama(model_path=args.gguf, n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads, n_threads_batch=threads,
                 seed=0, draft_model=draft, verbose=False,
                 **({"flash_attn": True, "type_v": GGML_TYPE_BF16} if args.engine_attention else {}))


# tokens, wall seconds, seconds to the first token (the server's: its prompt time), (drafted, accepted) or None
Run = tuple[list[int], float, float, tuple[int, int] | None]


def generate(llm: Any, ids: list[int], max_tokens: int, eos_ids: frozenset[int]) -> Run:
    """Greedy tokens after ``ids`` up to ``max_tokens`` or through the first EOS (kept, as Goose keeps it):
    (tokens, wall seconds, seconds to the first token, no draft stats)."""
    llm.reset()  # an empty KV cache: generate() would otherwise reuse a shared prefix of the last prompt
    output: list[int] = []
    first = 0.0
    started = time.perf_counter()
    # temp 0 is llama.cpp's greedy sampler; repeat_penalty 1.0 (generate's default) leaves the logits alone
    for token in llm.generate(ids, temp=0.0, repeat_penalty=1.0, reset=False):
        if not output:
            first = time.perf_counter() - started
        output.append(int(token))
        if token in eos_ids or len(output) >= max_tokens:
            break
    return output, time.perf_counter() - started, first, None


def serve_and_generate(args: argparse.Namespace, n_ctx: int, threads: int, ids: list[int], max_tokens: int) -> Run:
    """``ids`` through a llama-server of its own (an empty ngram-mod pool), started and stopped around the call.

    A short request first, as the ``Llama`` methods warm up: 8 tokens after the prompt's first 8, fewer than
    ngram-mod's lookup length together, so nothing enters the pool.
    """
    from llama_server import LlamaServer  # beside this file: run by its path, its folder is on sys.path

    with LlamaServer(args.server, server_arguments(args, n_ctx, threads), Path(args.out) / SERVER_LOG) as server:
        server.complete(ids[:WARMUP_TOKENS], WARMUP_TOKENS)
        return server.complete(ids, max_tokens)


def run(args: argparse.Namespace, prompts: list[dict[str, Any]], eos_ids: frozenset[int]
        ) -> tuple[list[Generation], dict[str, Any]]:
    drafted = max(args.num_pred_tokens, NGRAM_MOD["n_max"] if SERVER_NGRAM in args.methods else 0)
    n_ctx = context_length(prompts, args.max_tokens, drafted)
    threads = args.threads or _cpu_count()
    engines = {method: build(method, args, n_ctx) for method in args.methods if method != SERVER_NGRAM}
    decoders: dict[str, Callable[[list[int], int], Run]] = {
        method: (lambda ids, limit, llm=llm: generate(llm, ids, limit, eos_ids)) for method, llm in engines.items()}
    if SERVER_NGRAM in args.methods:  # a server per run (it warms itself up)
        decoders[SERVER_NGRAM] = lambda ids, limit: _through_eos(
            serve_and_generate(args, n_ctx, threads, ids, limit), eos_ids)
    for llm in engines.values():  # warm-up on the first prompt, as Goose's bench warms up its own
        generate(llm, prompts[0]["ids"], WARMUP_TOKENS, eos_ids)
    runs: dict[int, dict[str, list[tuple[Any, ...]]]] = {}  # per prompt and method: every run, and when it ended

    def turn(index: int, repeat: int) -> None:
        prompt = prompts[index]
        # the order rotates per prompt and repeat, as Goose's own methods' does
        shift = (index + repeat) % len(args.methods)
        for method in [*args.methods[shift:], *args.methods[:shift]]:
            output, wall, first, stats = decoders[method](prompt["ids"], args.max_tokens)
            runs.setdefault(index, {}).setdefault(method, []).append((output, wall, first, stats, time.time()))
            drafts = f", {stats[1]} of {stats[0]} drafted accepted" if stats else ""
            print(f"  {prompt['dataset']}/{prompt['question_id']} {method}: {len(output)} tokens in {wall:.2f} s "
                  f"({len(output) / wall if wall > 0 else 0.0:.1f} tok/s{drafts})", flush=True)

    if args.turns:
        print(READY, flush=True)
        for line in sys.stdin:
            parts = line.split()
            if len(parts) != 2 or not all(part.isdigit() for part in parts) or int(parts[0]) >= len(prompts):
                raise SystemExit(f"turn {line.strip()!r}: not 'INDEX REPEAT' with INDEX < {len(prompts)}")
            index, repeat = int(parts[0]), int(parts[1])
            turn(index, repeat)
            print(f"{DONE} {index} {repeat}", flush=True)
    else:
        for index in range(len(prompts)):
            for repeat in range(args.repeats):
                turn(index, repeat)
    generations = []
    for index in sorted(runs):
        for method in args.methods:
            found = runs[index].get(method)
            if not found:
                continue
            # goose_bench.medians.middle_by, written out: this runner imports nothing of goose or goose_bench (the
            # llama.cpp environment need hold llama-cpp-python only; goose bench puts nothing on its path)
            output, wall, first, stats, ended = sorted(found, key=lambda r: r[1])[(len(found) - 1) // 2]
            generations.append(Generation(method, index, output, wall, first, [r[1] for r in found],
                                          all(r[0] == found[0][0] for r in found), ended, *(stats or (None, None))))
    import llama_cpp

    # llama-cpp-python's wrapper of llama_model (no public accessor); a vocabulary-only load where only the server ran
    model = (next(iter(engines.values())) if engines else
             llama_cpp.Llama(model_path=args.gguf, vocab_only=True, verbose=False))._model
    conditions = {
        "engine": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
        "gguf": str(Path(args.gguf).resolve()),
        "gguf_bytes": Path(args.gguf).stat().st_size,
        "n_params": int(model.n_params()),
        "threads": threads,
        "n_ctx": n_ctx,
        "max_tokens": args.max_tokens,
        "num_pred_tokens": args.num_pred_tokens,
        "max_ngram_size": args.max_ngram_size,
        "repeats": args.repeats,
        "engine_attention": args.engine_attention,
        "ggml_cpu_tiled_mm": os.environ.get("GGML_CPU_TILED_MM"),  # ggml's switch (goose's llama.cpp engine sets 0)
        "python": platform.python_version(),
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
    }
    if SERVER_NGRAM in args.methods:
        conditions["server"] = {"binary": str(Path(args.server).resolve()), "spec_type": "ngram-mod",
                                "arguments": server_arguments(args, n_ctx, threads)}
    return generations, conditions


def _through_eos(run: Run, eos_ids: frozenset[int]) -> Run:
    """The server stops at the model's end-of-generation tokens; ours may be fewer: cut at our first, as
    ``generate`` stops (the server's time still covers what it decoded past it)."""
    output = run[0]
    ends = [i for i, token in enumerate(output) if token in eos_ids]
    return (output[:ends[0] + 1], *run[1:]) if ends else run


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    refused = llama_cpp_refusal()
    if refused:  # before anything imports llama_cpp: loading it would die with SIGILL ("Illegal instruction")
        print(refused, file=sys.stderr)
        return REFUSED_STATUS
    document = json.loads(Path(args.prompts).read_text())
    prompts, eos_ids = document["prompts"], frozenset(int(t) for t in document["eos_ids"])
    if not prompts:
        print("no prompts", file=sys.stderr)
        return 2
    generations, conditions = run(args, prompts, eos_ids)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"conditions": conditions, "methods": args.methods, "prompts": prompts,
               "generations": [asdict(g) | {"tokens_per_s": g.tokens_per_s} for g in generations]}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
