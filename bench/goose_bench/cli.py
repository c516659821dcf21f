"""``goose bench MODE``: the paper's tables on real models, Goose side by side with the peers.

Each mode a subcommand with its own flags, the ones they share from parent parsers:

- ``run``: our methods x the prompts, one request at a time (the study); ``suite NAME``: the same with methods
  generated from the registry; ``llama``: the same, greedy, llama.cpp's peers taking turns with ours per prompt;
- ``load``: many requests at once, closed-loop clients at each concurrency; ``vllm``: the same, then vLLM;
- ``layouts``: a GGUF file re-quantized, measured beside the shipped one (cost curve, perplexity);
- ``methods``: every method and whether it can run.

Registered through goose-bench's ``goose`` entry point (:func:`goose_register_commands`); importing this
module costs only argparse (the runner, torch and matplotlib load when the command runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from goose.cli import (
    add_model_arguments,
    add_prompt_arguments,
    add_sampling_arguments,
    add_tree_arguments,
    check_engine,
)
from goose.hookspecs import Register, hookimpl

if TYPE_CHECKING:
    from goose_bench.llama_peer import LlamaAlongside
    from goose_bench.peer_script import PeerScript
    from goose_bench.runner import BenchSettings

QUICK_LIMIT = 2
QUICK_MAX_NEW_TOKENS = 64
DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_OUT = "bench-results"


def _names(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _parent() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False)


def _common_flags() -> argparse.ArgumentParser:
    """What every mode takes: the models, the prompts, where results go."""
    parser = _parent()
    add_model_arguments(parser, dtype="bfloat16")
    for action in parser._actions:  # one model or several: say so where the flag is documented
        if action.dest == "model":
            action.help = "model(s), comma-separated: smollm2-135m (default), gemma3-270m, a Hugging Face id or a path"
    parser.add_argument("--datasets", default=None,
                        help="comma-separated: humaneval, mbpp, classeval, gsm8k, mt_bench, spec_bench; where "
                             "prompt lookup is strongest: edit (code edits of installed packages' functions, see "
                             "python -m goose_bench.edit_set --list), rag, summarization (Spec-Bench's categories); "
                             "structured (numbered lists, tables, JSON, CSV and logs to continue or convert, written "
                             "for goose); or paths of JSONL files whose lines hold a 'prompt' string or a 'turns' "
                             "list, and optionally a 'prediction' (default: the paper's five)")
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts of each dataset")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default ./{DEFAULT_OUT})")
    parser.add_argument("--data-dir", default=None,
                        help="folder of benchmark JSONL files in the upstream formats (default $GOOSE_DATA, else "
                             "the prompts goose ships, answers left out: bench/goose_bench/data/README.md)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what the flags expand to (every method's sources, topology and config, the "
                             "prompts per dataset) and the passes and time the run would take at most, then exit "
                             "without loading any model")
    return parser


def _study_flags() -> argparse.ArgumentParser:
    """The per-prompt study's (run, suite, llama): our methods, one request at a time."""
    parser = _parent()
    parser.add_argument("--methods", default=None,
                        help="comma-separated methods: built-in names (see `goose bench methods`) or "
                             "SOURCES@TOPOLOGY for any registered sources and topology, sources joined by '+' (a "
                             "source's registered short name stands for it: cm, bt, la, sm), e.g. freq_next@chain or "
                             "context_match+freq_next@multi_spine (default: the main table); ar is always run, as "
                             "the baseline")
    parser.add_argument("--methods-file", type=Path, default=None, metavar="STUDY.toml",
                        help="named methods, one [methods.NAME] table of GooseConfig fields each (TOML or .json), "
                             "for what SOURCES@TOPOLOGY cannot say; run after --methods")
    add_tree_arguments(parser, applies_to="every composed, suite and study-file method (built-in names keep theirs)")
    parser.add_argument("--cost-curve", default=None, metavar="device|FILE",
                        help="the deterministic mode (with --dtype float32): also price every sample's verify passes "
                             "on this device's measured cost curve (device) or a curve file (`goose calibrate --json` "
                             "output, e.g. measured on a GPU) and report the implied speedup over ar, labelled as an "
                             "estimate: sources ranked without the clock's noise")
    add_prompt_arguments(parser, max_new_tokens=None,
                         default=f"{DEFAULT_MAX_NEW_TOKENS}; --quick: {QUICK_MAX_NEW_TOKENS}")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: the paper's five datasets, {QUICK_LIMIT} prompts each, "
                             f"{QUICK_MAX_NEW_TOKENS} tokens, methods ar,pld,goose,hf_pld (explicit flags win)")
    parser.add_argument("--warm-sources", action="store_true",
                        help="one decoder per method for all prompts, in order, so sources keep what they learned "
                             "(estimates, tables, suffix_memory's earlier outputs); default: a fresh decoder per "
                             "prompt")
    parser.add_argument("--datastore", type=Path, default=None,
                        help="REST's datastore (a `goose datastore build` folder, built with the benchmarked model's "
                             "tokenizer) for every method that drafts from REST (default: the Python standard "
                             "library's, built on first use)")
    parser.add_argument("--repeats", type=int, default=1, metavar="N",
                        help="time every method N times on every prompt (fresh decoders, rotated order) and keep "
                             "the run with the median wall time; every run's time is in results.jsonl (wall_s_runs)")
    parser.add_argument("--memo", default=None, type=Path, metavar="DIR",
                        help="where the target's memo lives (default: a folder under Goose's cache): rows any run "
                             "verified before are read, not run; where it cannot be exact (bfloat16, int8, "
                             "llama.cpp, sampling, --repeats) every pass runs for real, and the run says why")
    parser.add_argument("--no-memo", action="store_true", help="run every pass for real")
    parser.add_argument("--resume", action="store_true",
                        help="go on where a stopped run in --out stopped: the method x prompt cells already in its "
                             "results.jsonl are kept, the rest run")
    return parser


def _sampling_flags() -> argparse.ArgumentParser:
    parser = _parent()
    add_sampling_arguments(parser)
    parser.set_defaults(seed=0)  # sampled runs: sample i of the run draws with seed + i, for every method
    return parser


def _load_flags() -> argparse.ArgumentParser:
    """Many requests at once (load, vllm): closed-loop clients, greedy."""
    parser = _parent()
    parser.add_argument("--concurrency", default="1,2,4,8", metavar="C1,C2,...",
                        help="the concurrencies: closed-loop clients, each many at once (default 1,2,4,8)")
    parser.add_argument("--methods", default=None, metavar="M1,M2,...",
                        help="ours, from ar, goose (the batched engine), hf_ar (Hugging Face's batched generate) and "
                             "goose_own (each row its own bigram table) (default ar,goose,hf_ar)")
    add_prompt_arguments(parser, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    parser.set_defaults(run=_run_load, temperature=None)
    return parser



def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``goose bench MODE``: each mode its own flags, the flags every mode shares from parent parsers."""
    common, study, sampling, load = _common_flags(), _study_flags(), _sampling_flags(), _load_flags()
    modes = parser.add_subparsers(title="modes", dest="mode", metavar="MODE", required=True)

    def mode(name: str, parents: list[argparse.ArgumentParser], description: str) -> argparse.ArgumentParser:
        return modes.add_parser(name, parents=parents, help=description, description=description)

    run = mode("run", [common, study, sampling],
               "methods x prompts, one request at a time: speedup, tau and acceptance per method and dataset "
               "(ar is the baseline)")
    run.set_defaults(run=_run_study)
    suite = mode("suite", [common, study, sampling],
                 "the study run with methods generated from the registry for --sources (after --methods)")
    suite.add_argument("suite", metavar="NAME",  # checked by goose_bench.methods.suite_methods, against its names
                       help="ablation (the paper's five, the default without each of its sources, each other source "
                            "alone, added to the default and in place of each default source), synergy (each source "
                            "alone, every pair), three-source (every pair and triple under spine, multi_spine and "
                            "isotropic at an equal budget: --budget, else 16), sweep (budget, depth, spine ratio, "
                            "rho around the default)")
    suite.add_argument("--sources", default=None, metavar="A,B,...",
                       help="the sources the suite studies, built-in or installed (default: the built-in ones that "
                            "draft from the context alone, GooseConfig's default sources first)")
    suite.add_argument("--disable", action="append", default=[], metavar="NAME",
                       help="leave this source out (repeatable)")
    suite.set_defaults(run=_run_study)
    llama = mode("llama", [common, study],
                 "the study run, greedy, with llama.cpp on the same prompts (first turns), one request at a time, "
                 "the two sides taking turns prompt by prompt: plain (llama), its prompt lookup (llama_pld) and its "
                 "server's ngram-mod (llama_server_ngram), reading the model's GGUF file as shipped; tok/s side by "
                 "side with ours in report.md and summary.json")
    llama.add_argument("--python", default=sys.executable, metavar="PATH",
                       help="the llama.cpp environment's interpreter, which runs goose_bench/peers/llama_runner.py "
                            "(default: this one, e.g. .venv/bin/python after `make llama-setup`); its files go to "
                            "--out's llama/ folder")
    llama.add_argument("--llama-methods", default=None, metavar="M1,M2,...",
                       help="llama.cpp's methods, from llama, llama_pld and llama_server_ngram (its server with "
                            "--spec-type ngram-mod: the binary `make llama-server` builds); default all three, "
                            "llama_server_ngram left out with a notice where it is not built")
    llama.set_defaults(run=_run_study, temperature=None, top_p=None, top_k=None, seed=0)
    mode("load", [common, load],
         "many requests at once instead of the per-prompt tables: closed-loop clients at each concurrency, methods "
         "ar, goose (the batched engine) and hf_ar (Hugging Face's batched generate), and goose_own when --methods "
         "names it; writes concurrency.json/.md/.png")
    vllm = mode("vllm", [common, load],
                "the load run, then vLLM at the same concurrencies on the same prompts: its rows vllm_none, "
                "vllm_ngram, vllm_goose join concurrency.json/.md/.png")
    vllm.add_argument("--python", required=True, metavar="PATH",
                      help="the vLLM environment's interpreter, e.g. .venv-vllm/bin/python, which runs "
                           "goose_bench/peers/vllm_runner.py; its files go to --out's vllm/ folder, one per model "
                           "when there are several")
    vllm.add_argument("--vllm-methods", default=None, metavar="M1,M2,...",
                      help="the vLLM runner's methods (default none,ngram,goose; none is kept as its reference)")
    from goose_bench import layouts as written  # the standard library only, as this module

    layouts = mode("layouts", [],
                   "write a GGUF file re-quantized into layouts whose every tensor has a batched x86 kernel, and "
                   "measure each beside the file as shipped: t(n) / t(1) of llama.cpp's verify passes and perplexity "
                   "on the standard library's argparse and difflib sources; writes layouts.json and layouts.png")
    layouts.add_argument("--model", default=written.DEFAULT_MODEL,
                         help="an embedded model with a GGUF file or a .gguf path: the file as shipped, which is "
                              f"re-quantized and measured first (default {written.DEFAULT_MODEL})")
    layouts.add_argument("--layouts", default="iq4_nl", metavar="L1,L2,...",
                         help="comma-separated, from q4_0 (every tensor Q4_0), iq4_nl (every tensor IQ4_NL) and "
                              "q4_k-q8_0-head (Q4_K, the head and embedding Q8_0) (default iq4_nl)")
    layouts.add_argument("--out", default=written.DEFAULT_OUT,
                         help="folder of the written files, layouts.json and layouts.png; a file already there is "
                              f"kept, not written again (default ./{written.DEFAULT_OUT})")
    layouts.add_argument("--threads", type=int, default=None,
                         help="llama.cpp's threads, writing and measuring (default: the CPUs this process may use)")
    layouts.add_argument("--rounds", type=int, default=5,
                         help="rounds of the cost measurement, every file once a round (default 5)")
    layouts.add_argument("--windows", type=int, default=written.WINDOWS,
                         help=f"perplexity: windows of the text, each from an empty cache (default {written.WINDOWS})")
    layouts.add_argument("--window-tokens", type=int, default=written.WINDOW_TOKENS,
                         help=f"perplexity: tokens a window (default {written.WINDOW_TOKENS})")
    layouts.add_argument("--no-progress", action="store_true", help="no progress lines")
    layouts.set_defaults(run=_run_layouts)
    modes.add_parser("methods", help="print every method and whether it can run",
                     description="Print every method and whether it can run.").set_defaults(run=_list_methods)


def _method_list(args: argparse.Namespace) -> list[Any]:
    """What --methods, --methods-file and a suite name, checked before any model loads: names and Method objects."""
    from goose.cli import parse_budget
    from goose_bench.methods import (
        ALL_METHODS,
        MAIN_METHODS,
        QUICK_METHODS,
        Overrides,
        read_study_file,
        resolve_methods,
        suite_methods,
    )

    config = json.loads(args.config) if args.config else {}
    if not isinstance(config, dict):
        raise ValueError("--config must be a JSON object of GooseConfig fields")
    if {"sources", "topology"} & set(config):
        raise ValueError("--config: name sources and topology in the method (SOURCES@TOPOLOGY), not in --config")
    overrides = Overrides(parse_budget(args.budget), config)
    methods: list[Any] = list(_names(args.methods))
    if args.methods_file is not None:
        methods += read_study_file(args.methods_file, overrides)
    if args.mode == "suite":
        methods += suite_methods(args.suite, _names(args.sources) or None, args.disable, overrides)
    llama_engine = args.engine == "llama.cpp"
    if not methods:  # on the llama.cpp engine, llama.cpp's own peers stand in for Hugging Face's generate
        methods = [m for m in (QUICK_METHODS if args.quick else MAIN_METHODS)
                   if not llama_engine or ALL_METHODS[m].kind != "hf"]
    resolved = resolve_methods(methods, overrides)  # unknown names fail here, before any model is loaded
    peers = [m.name for m in resolved if m.kind == "hf"] if llama_engine else []
    if peers:
        raise ValueError(f"--engine llama.cpp: {', '.join(peers)} run Hugging Face's generate on torch weights; "
                         "leave them out (llama.cpp's plain decoding and prompt lookup run as peers)")
    if (args.budget is not None or args.config) and all(ALL_METHODS.get(m.name) is m for m in resolved):
        raise ValueError("--budget and --config apply to composed (SOURCES@TOPOLOGY), suite and study-file methods, "
                         "and none is named: built-in names keep their definitions")
    return resolved


def _list_methods(args: argparse.Namespace) -> int:
    """``goose bench methods``: the built-in names, the registered plugins a composed method may name, the suites."""
    from goose.plugins import registry
    from goose_bench.methods import ALL_METHODS, SUITE_NAMES, unavailable_reason

    width = max(len(name) for name in ALL_METHODS)
    print("built-in names:")
    for name, method in ALL_METHODS.items():
        reason = unavailable_reason(method)
        state = "ok" if reason is None else f"unavailable: {reason}"
        print(f"  {name:<{width}}  {method.group:<16}  {method.description}  [{state}]")
    known = registry()
    print("\ncomposed: SOURCES@TOPOLOGY, sources joined by '+' (a source's short name, in brackets, stands for it)")
    sources = [f"{name} ({r.short_name})" if r.short_name else name for name, r in known.sources.items()]
    print(f"  sources:    {', '.join(sources)}")
    print(f"  topologies: {', '.join(known.topologies)}")
    print(f"\nsuites (goose bench suite NAME, with --sources and --disable): {', '.join(SUITE_NAMES)}")
    return 0


def _datastore(path: Path | None) -> Path | None:
    """``--datastore`` checked before any model loads: a datastore folder, resolved (None: REST's default)."""
    if path is None:
        return None
    from goose.sources.rest.datastore import read_manifest
    from goose.sources.rest.suffix_index import DatastoreError

    folder = path.expanduser().resolve()
    try:
        read_manifest(folder)
    except DatastoreError as error:
        raise ValueError(f"--datastore {path}: {error}") from None
    return folder


class _Prompts(NamedTuple):
    """What every mode checks first, before any model loads: the models and the prompts."""

    models: list[str]
    datasets: list[str]
    data_dir: Path
    limit: int | None
    max_new_tokens: int


def _prompts(args: argparse.Namespace) -> _Prompts:
    from goose_bench.prompts import PAPER_DATASETS, default_data_dir

    quick = getattr(args, "quick", False)
    max_new_tokens = args.max_new_tokens or (QUICK_MAX_NEW_TOKENS if quick else DEFAULT_MAX_NEW_TOKENS)
    limit = args.limit if args.limit is not None else (QUICK_LIMIT if quick else None)
    if max_new_tokens <= 0:
        raise ValueError(f"--max-new-tokens must be positive, got {max_new_tokens}")
    if limit is not None and limit <= 0:
        raise ValueError(f"--limit must be positive, got {limit}")
    if args.threads is not None and args.threads <= 0:
        raise ValueError(f"--threads must be positive, got {args.threads}")
    model_names = _names(args.model)
    if not model_names:
        raise ValueError("--model names no model")
    check_engine(args)
    datasets = _names(args.datasets) or list(PAPER_DATASETS)
    data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
    return _Prompts(model_names, datasets, data_dir, limit, max_new_tokens)


def _run_study(args: argparse.Namespace) -> int:
    """``goose bench run``, ``suite NAME`` and ``llama``: methods x prompts, one request at a time (and llama.cpp's
    peers taking turns with them, in ``llama``)."""
    from goose.config import SamplingParams

    prompts = _prompts(args)
    methods = _method_list(args)
    if args.cost_curve is not None and args.dtype != "float32":
        raise ValueError("--cost-curve prices float32 runs, where every lossless method decodes ar's text and only "
                         "its passes differ; add --dtype float32")
    datastore = _datastore(args.datastore)
    llama = None
    if args.mode == "llama":
        from goose_bench.llama_peer import llama_peer

        llama = llama_peer(args.python, prompts.models, args.llama_methods)  # every check before any model loads
    if args.dry_run:
        return _dry_run(args, prompts, methods)

    from goose_bench.outputs import write_outputs
    from goose_bench.report import main_table
    from goose_bench.runner import RESULTS_FILE, Bench, BenchSettings

    out = Path(args.out).expanduser()
    sampling = SamplingParams(temperature=args.temperature or 0.0, top_p=args.top_p if args.top_p is not None else 1.0,
                              top_k=args.top_k or 0)  # bad values: a one-line error, before any model loads
    if args.seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {args.seed}")
    suite = args.mode == "suite"
    settings = BenchSettings(
        models=prompts.models, datasets=prompts.datasets, methods=methods, out=out, data_dir=prompts.data_dir,
        limit=prompts.limit, max_new_tokens=prompts.max_new_tokens, dtype=args.dtype, quantize=args.quantize,
        device=args.device, seed=args.seed, threads=args.threads,
        chat=not args.no_chat, progress=not args.no_progress, warm_sources=args.warm_sources, sampling=sampling,
        datastore=datastore, repeats=args.repeats, cost_curve=args.cost_curve, engine=args.engine,
        memo=not args.no_memo, memo_dir=args.memo.expanduser() if args.memo else None, resume=args.resume,
        extra={"quick": args.quick, "suite": args.suite if suite else None,
               "suite_sources": (_names(args.sources) or None) if suite else None,
               "disabled": (args.disable or None) if suite else None},
    )
    alongside = _llama_alongside(llama, settings) if llama is not None else None
    bench = Bench(settings, alongside)  # reads the datasets: a missing file fails before any model is loaded
    llama_sections: dict[str, dict] = alongside.sections if alongside is not None else {}
    try:
        bench.run()
        if alongside is not None and alongside.failure is not None:
            raise alongside.failure
    finally:  # an interrupted run (or a failed llama.cpp one) still leaves the summary and report of what it measured
        summaries = [s for s in bench.summaries() if s["results"]]
        files = None
        if len(llama_sections) > 1:
            from goose_bench.llama_peer import across_files

            files = across_files(llama_sections)
        for summary in summaries:
            if summary["model"] in llama_sections:
                summary["llama"] = llama_sections[summary["model"]]
            if files and summary["model"] == files["first"]:  # the first file's plain llama.cpp is the yardstick
                summary["llama_files"] = files
        if summaries:
            written = write_outputs(summaries, out)
            for summary in summaries:
                print(f"\n{summary['model']} ({summary['dtype']}, {summary['device']})\n")
                print(main_table(summary))
                for name, reason in summary["unavailable"].items():
                    print(f"- {name}: unavailable: {reason}")
            state = "warm (one decoder per method, prompts in order)" if args.warm_sources else \
                "cold (a fresh decoder per prompt)"
            print(f"\nsources: {state}")
            print("wrote " + ", ".join(str(p) for p in [out / RESULTS_FILE, *written]))
    return 0


DRY_RUN_WARMUP_TOKENS = 8  # goose_bench.runner.BenchSettings.warmup_tokens


def _describe_method(method: Any) -> str:
    """One method as the run would build it: a Goose config's sources, topology, budget and changed fields; a peer's
    generate() arguments; or why it cannot run."""
    from goose_bench.methods import unavailable_reason

    if method.kind == "ar":
        return "one token per forward pass (the baseline)"
    if method.kind == "hf":
        arguments = ", ".join(f"{key}={value!r}" for key, value in method.fields.items())
        return f"model.generate({arguments})"
    reason = unavailable_reason(method)
    if reason is not None:
        return f"unavailable: {reason}"
    digest = method.config().digest()
    parts = [f"sources {'+'.join(digest['sources'])}", f"topology {digest['topology']}", f"budget {digest['budget']}"]
    for key in ("source_options", "topology_options", "changed"):
        if digest.get(key):
            parts.append(f"{key} {json.dumps(digest[key])}")
    return ", ".join(parts)


def _dry_run(args: argparse.Namespace, prompts: _Prompts, methods: list[Any] | None,
             concurrencies: list[int] | None = None) -> int:
    """``--dry-run``: the expansion of the flags and the size of the run; loads no model, writes nothing.
    ``methods`` None: the load modes' (``concurrencies``), named by ``--methods``."""
    from goose_bench.prompts import load_samples

    model_names, datasets, data_dir, limit, max_new_tokens = prompts
    print(f"goose bench {args.mode} --dry-run: nothing is loaded, run or written")
    print(f"models: {', '.join(model_names)} (engine {args.engine}, dtype {args.dtype}, device {args.device}"
          + (f", {args.quantize}" if args.quantize else "") + (f", {args.threads} threads" if args.threads else "")
          + ")")
    sampled = f"sampled (temperature {args.temperature}, seed {args.seed} + prompt index)" if args.temperature else \
        "greedy"
    if methods is not None:
        sources = "warm (one decoder per method)" if args.warm_sources else "cold (a fresh decoder per prompt)"
        sampled += f"; sources {sources}"
    print(f"decoding: {sampled}; {max_new_tokens} new tokens a turn at most")
    found = {spec: load_samples(spec, data_dir, limit) for spec in datasets}  # a bad dataset fails here, as in a run
    samples = [sample for group in found.values() for sample in group]
    turns = sum(len(sample.turns) for sample in samples)
    if methods is None:  # the load modes: their own methods, closed-loop clients over the first turns
        names = _load_methods(args)
        print(f"\nmethods (concurrency {','.join(map(str, concurrencies or ()))}): {', '.join(names)}, closed-loop "
              "clients over every prompt's first turn at each concurrency")
    else:
        print(f"\nmethods ({len(methods)}; ar is the baseline every speedup is over):")
        width = max(len(method.name) for method in methods)
        for method in methods:
            print(f"  {method.name:<{width}}  {method.kind:<5}  {_describe_method(method)}")
    print(f"\nprompts ({len(samples)}, {turns} turns; limit {limit if limit is not None else 'none'}):")
    for spec, group in found.items():
        categories = sorted({s.category for s in group if s.category})
        more = f"; categories {', '.join(categories)}" if 1 < len(categories) <= 12 else ""
        print(f"  {spec}: {len(group)} prompts, {sum(len(s.turns) for s in group)} turns{more}")
    if methods is None:
        return 0
    generations = len(model_names) * len(methods) * len(samples) * args.repeats
    per_turn = max_new_tokens - 1  # the prefill gives the first token; each verify pass at least one more (tau 1)
    passes = len(model_names) * len(methods) * turns * args.repeats * per_turn
    print(f"\nruns: {len(model_names)} model(s) x {len(methods)} methods x {len(samples)} prompts"
          + (f" x {args.repeats} repeats" if args.repeats > 1 else "")
          + f" = {generations} generations, after one warm-up of {DRY_RUN_WARMUP_TOKENS} tokens per method")
    prefills = len(model_names) * len(methods) * turns * args.repeats
    print(f"passes: at most {passes} verify passes beside {prefills} prefills "
          f"({max_new_tokens} new tokens a turn at tau 1: every method at worst one token a pass, as ar is)")
    curve_spec = args.cost_curve
    if curve_spec and curve_spec != "device":
        from goose_bench.estimate import load_curve

        curve = load_curve(curve_spec)
        seconds = passes * curve.seconds[0]
        print(f"time: about {seconds:.0f} s ({seconds / 60:.1f} min) of verify passes priced on {curve_spec} "
              f"(t(1) {1e3 * curve.seconds[0]:.2f} ms a pass, every pass at ar's cost; prefills, warm-ups and host "
              "time not counted): what ar takes, an upper bound for methods that accept drafts")
    else:
        why = "--cost-curve device is measured when the model loads" if curve_spec else "no --cost-curve FILE"
        print(f"time: not priced ({why}); the pass count above is a rough upper bound, reached when nothing "
              "drafted is accepted")
    return 0


def _llama_alongside(peer: PeerScript, settings: BenchSettings) -> LlamaAlongside:
    """llama.cpp taking turns with our methods on the samples and first-turn ids our run encodes, model by model."""
    import torch

    from goose.planning import machine
    from goose_bench.llama_peer import LlamaAlongside

    # the threads our side runs with: torch's, or the llama.cpp engine's (the CPU count unless --threads)
    threads = settings.threads or (machine.cpu_count() if settings.engine == "llama.cpp" else torch.get_num_threads())
    return LlamaAlongside(peer, settings.out, len(settings.models) > 1, settings.dtype, settings.quantize,
                          settings.max_new_tokens, threads, settings.repeats, progress=settings.progress,
                          engine=settings.engine)


def _load_methods(args: argparse.Namespace) -> list[str]:
    """Our methods of a load mode (``--methods``), checked."""
    from goose_bench.concurrency import CONCURRENCY_METHODS, OPTIONAL_METHODS

    methods = _names(args.methods) or [m for m in CONCURRENCY_METHODS if args.engine != "llama.cpp" or m != "hf_ar"]
    if args.engine == "llama.cpp" and "hf_ar" in methods:
        raise ValueError("--engine llama.cpp: hf_ar runs Hugging Face's generate on torch weights; leave it out")
    unknown = [m for m in methods if m not in CONCURRENCY_METHODS + OPTIONAL_METHODS]
    if unknown:
        raise ValueError(f"goose bench {args.mode} runs the methods {', '.join(CONCURRENCY_METHODS + OPTIONAL_METHODS)}"
                         f"; not {', '.join(unknown)}")
    return methods


def _run_load(args: argparse.Namespace) -> int:
    """``goose bench load`` and ``vllm``: closed-loop clients at each concurrency (and vLLM after ours, in ``vllm``)."""
    from goose_bench.concurrency import run_concurrency, write_concurrency
    from goose_bench.peer_script import peer_folder
    from goose_bench.prompts import load_samples
    from goose_bench.vllm_peer import run_vllm_bench, vllm_command, vllm_peer, vllm_rows

    prompts = _prompts(args)
    model_names, datasets, data_dir, limit, max_new_tokens = prompts
    try:
        concurrencies = sorted({int(part) for part in _names(args.concurrency)})
    except ValueError:
        raise ValueError(f"--concurrency takes integers, e.g. 1,2,4,8; got {args.concurrency!r}") from None
    if not concurrencies or concurrencies[0] < 1 or concurrencies[-1] > 64:
        raise ValueError(f"--concurrency takes integers in 1..64, got {args.concurrency!r}")
    methods = _load_methods(args)
    peer = None
    if args.mode == "vllm":
        peer = vllm_peer(args.python, args.vllm_methods)
        if args.no_chat:
            raise ValueError("goose bench vllm: the vLLM runner always applies the chat template; leave --no-chat out")
        from goose.models import resolve_dtype

        vllm_dtype = str(resolve_dtype(args.dtype)).removeprefix("torch.")  # its --dtype takes full names only
    if args.dry_run:
        return _dry_run(args, prompts, None, concurrencies)
    samples_per_dataset = [load_samples(name, data_dir, limit) for name in datasets]
    samples = [sample for found in samples_per_dataset for sample in found]
    from goose.cli import load_model
    from goose.models import encode_prompt, pretrained_location

    rows = []
    measured: dict[str, tuple[list[list[int]], list[list[int]]]] = {}  # model -> (prompt ids, AR reference outputs)
    for model_name in model_names:
        args.model = model_name
        model, tokenizer = load_model(args)
        prompt_ids = [encode_prompt(tokenizer, sample.turns[0], chat=not args.no_chat) for sample in samples]
        print(f"{model_name}: {len(prompt_ids)} prompts from {', '.join(datasets)}, {max_new_tokens} tokens, "
              f"concurrency {', '.join(map(str, concurrencies))}", flush=True)
        model_rows, reference = run_concurrency(model_name, model, tokenizer, prompt_ids, concurrencies, methods,
                                                max_new_tokens, progress=not args.no_progress)
        rows += model_rows
        measured[model_name] = (prompt_ids, reference)
        del model, tokenizer  # vLLM's engines come next; the memory is theirs
    out = Path(args.out).expanduser()
    written = write_concurrency(rows, out)  # ours first: a failed vLLM run loses nothing we measured
    if peer is not None:
        # None means every sample of each dataset; the vLLM runner needs a number, and the largest count is that
        vllm_limit = limit or max(len(found) for found in samples_per_dataset)
        notes: dict[str, list[str]] = {}
        for model_name, (prompt_ids, reference) in measured.items():
            folder = peer_folder(out, "vllm", model_name, len(model_names) > 1)
            command = vllm_command(peer, pretrained_location(model_name), datasets, data_dir, vllm_limit,
                                   max_new_tokens, vllm_dtype, concurrencies, folder)
            print(f"{model_name}: vLLM {', '.join(peer.methods)} at concurrency {', '.join(map(str, concurrencies))}"
                  f" ({peer.script.name}, into {folder})", flush=True)
            results = run_vllm_bench(command, folder, progress=not args.no_progress)
            model_rows, notes[model_name] = vllm_rows(results, model_name, prompt_ids, reference)
            rows += model_rows
            written = write_concurrency(rows, out, notes)
    print((out / "concurrency.md").read_text())
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _run_layouts(args: argparse.Namespace) -> int:
    """``goose bench layouts``: re-quantized GGUF files beside the shipped one, their cost curves and perplexity."""
    from goose_bench.layouts import (
        LAYOUTS_FILE,
        PLOT_FILE,
        check_model,
        layout_names,
        layouts_table,
        run_layouts,
        threads_phrase,
    )

    layouts = layout_names(args.layouts)  # every check before anything loads
    check_model(args.model)
    out = Path(args.out).expanduser()
    document = run_layouts(args.model, layouts, out, threads=args.threads, rounds=args.rounds, windows=args.windows,
                           window_tokens=args.window_tokens, progress=not args.no_progress)
    conditions = document["conditions"]
    print(f"{threads_phrase(conditions['threads'])}, {conditions['cpu']}; t(n) / t(1) median of {conditions['rounds']} "
          f"rounds; perplexity on {conditions['text']['scored_tokens']} tokens of argparse and difflib\n")
    print(layouts_table(document))
    print("\nwrote " + ", ".join(str(out / name) for name in (LAYOUTS_FILE, PLOT_FILE) if (out / name).is_file()))
    return 0


@hookimpl
def goose_register_commands(register: Register) -> None:
    """`goose bench`, through goose-bench's `goose` entry point (bench/pyproject.toml), as any plugin's command."""
    register("bench", add_arguments,
             description="reproduce the paper's tables: speedup, tau, acceptance per method and dataset")
