"""The ``goose`` command and its built-in subcommands generate, plugins and calibrate.

Every subcommand comes through the ``goose_register_commands`` hook of a ``goose`` entry point, these three too
(goose's pyproject names this module); ``serve`` is goose.serve.cli's, ``datastore`` the rest source's, ``bench``
goose-bench's. The ``add_*_arguments`` helpers below are the flags those commands share.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from goose.config import first_error
from goose.hookspecs import Register, hookimpl
from goose.plugins import PluginError, registry

logger = logging.getLogger("goose")

# errors a user can act on: one line on stderr and exit status 2, never a traceback
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, PluginError, FileNotFoundError)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="goose: %(levelname)s: %(message)s")
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except ValidationError as error:
        print(f"goose: error: {first_error(error)}", file=sys.stderr)
    except USER_ERRORS as error:
        print(f"goose: error: {error}", file=sys.stderr)
    except KeyboardInterrupt:
        print("goose: interrupted", file=sys.stderr)
        return 130
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="goose", description="Lossless, training-free speculative decoding.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (model loading, plugins)")
    commands = parser.add_subparsers(title="commands")
    for name, command in registry().commands.items():  # goose's own first, then other distributions'
        command.factory(commands.add_parser(name, help=command.description, description=command.description))
    return parser


class _Default(str):
    """A flag's default value, told apart from the same value given on the command line."""


def add_model_arguments(parser: argparse.ArgumentParser, *, dtype: str = "float32") -> None:
    parser.add_argument("--model", default="smollm2-135m",
                        help="smollm2-135m (embedded default), gemma3-270m, a Hugging Face id or a local path "
                             "(--engine llama.cpp: an embedded model or a .gguf file)")
    parser.add_argument("--engine", default="torch", choices=("torch", "llama.cpp"),
                        help="torch (default): the model's weights in --dtype through transformers; llama.cpp: the "
                             "GGUF file as shipped, its quantized weights through llama.cpp (CPU; `make llama-setup`)")
    parser.add_argument("--dtype", default=_Default(dtype), help="float32 (token-exact), bfloat16 or float16")
    parser.add_argument("--device", default=_Default("cpu"), help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice; "
                        "llama.cpp: the CPU count)")
    parser.add_argument("--quantize", choices=("int8",), default=None,
                        help="int8: every linear layer in int8 through oneDNN (CPU with VNNI or AMX), the rest in "
                             "--dtype; lossless against the int8 model's own decoding")


def check_engine(args: argparse.Namespace) -> None:
    """Refuse, before any model loads, the model flags that ``--engine llama.cpp`` cannot honour; on that engine the
    weights' type reads ``gguf`` (the file's own quantization) wherever a report names the dtype."""
    if args.engine != "llama.cpp":
        return
    if args.quantize:
        raise ValueError(f"--engine llama.cpp runs the GGUF file's own quantized weights; leave out --quantize "
                         f"{args.quantize}")
    for flag, value in (("--dtype", args.dtype), ("--device", args.device)):
        if not isinstance(value, _Default):
            raise ValueError(f"--engine llama.cpp runs the GGUF file's own quantized weights on the CPU; leave out "
                             f"{flag} {value}")
    args.dtype = _Default("gguf")


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sources", default=None,
                        help="comma-separated candidate sources (default: context_match,bigram_transition)")
    parser.add_argument("--disable", action="append", default=[], metavar="NAME",
                        help="switch a source off (repeatable), e.g. for ablations")
    parser.add_argument("--topology", default=None, help="draft-tree planner (default: spine)")
    add_tree_arguments(parser)


def add_tree_arguments(parser: argparse.ArgumentParser, *, applies_to: str = "") -> None:
    """``--budget`` and ``--config``, read by :func:`parse_budget` and as a JSON object of GooseConfig fields;
    ``applies_to`` names the decoders they set where a command builds several (``goose bench``)."""
    scope = f", for {applies_to}" if applies_to else ""
    parser.add_argument("--budget", default=None, help=f"draft-tree node budget, or 'auto'{scope}")
    parser.add_argument("--config", default=None, metavar="JSON",
                        help="extra GooseConfig fields (source_options included) as a JSON object, e.g. "
                             f"'{{\"max_depth\": 4}}'{scope}")


def add_prompt_arguments(parser: argparse.ArgumentParser, *, max_new_tokens: int | None, default: str = "") -> None:
    """``--max-new-tokens`` (``default`` says what None means) and ``--no-chat``: what every prompt is given."""
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens, metavar="N",
                        help=f"new tokens per answer at most (default {default or max_new_tokens})")
    parser.add_argument("--no-chat", action="store_true", help="do not apply the model's chat template")


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=None,
                        help="0 (default): greedy; > 0: sample, losslessly (the seeded autoregressive sampler)")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass in (0, 1] (default 1)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens (0: all)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the draws (a non-negative integer; default: random, reported in --json)")


def decoding_config(args: argparse.Namespace) -> Any:
    """The GooseConfig named by the command-line flags (validated; unknown plugins are reported)."""
    from goose.config import GooseConfig

    fields: dict[str, Any] = json.loads(args.config) if args.config else {}
    if not isinstance(fields, dict):
        raise ValueError("--config must be a JSON object")
    if args.sources is not None:
        fields["sources"] = [s.strip() for s in args.sources.split(",") if s.strip()]
    if args.topology is not None:
        fields["topology"] = args.topology
    if args.budget is not None:
        fields["budget"] = parse_budget(args.budget)
    for name in ("temperature", "top_p", "top_k", "seed"):
        if getattr(args, name, None) is not None:
            fields[name] = getattr(args, name)
    config = GooseConfig.model_validate(fields)
    for name in args.disable:
        registry().source(name)  # unknown names are an error, not a silent no-op
    config.sources = [s for s in config.sources if s not in set(args.disable)]
    if not config.sources:
        raise PluginError("every source is disabled: keep at least one")
    for name in config.sources:
        registry().source(name)
    registry().topology(config.topology)
    return config


def load_model(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch

    from goose import models

    check_engine(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.engine == "llama.cpp":
        return models.load_gguf(args.model, threads=args.threads)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return models.load(args.model, dtype=args.dtype, device=device, quantize=args.quantize)


def weights(args: argparse.Namespace) -> str:
    """How the model flags say the weights run, for a banner: ``bfloat16``, or ``int8 linears, bfloat16``."""
    return f"{args.quantize} linears, {args.dtype}" if args.quantize else args.dtype


def parse_budget(text: str | None) -> int | str | None:
    """``--budget``: a node count or 'auto' (None: not given)."""
    if text is None or text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--budget must be an integer or 'auto', got {text!r}") from None


# --- goose generate -----------------------------------------------------------------------------


def _add_generate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", nargs="?", default=None, help="the prompt text, or - to read it from stdin")
    parser.add_argument("--prompts", default=None, metavar="FILE",
                        help="decode many prompts together: a JSONL file, one object per line with a 'prompt' "
                             "(and optionally 'max_new_tokens', 'prediction', 'seed'); - reads stdin")
    parser.add_argument("--max-batch", type=int, default=None, metavar="N",
                        help="with --prompts: at most N requests decode together (default: all)")
    add_model_arguments(parser)
    add_decoding_arguments(parser)
    add_sampling_arguments(parser)
    add_prompt_arguments(parser, max_new_tokens=128)
    parser.add_argument("--compare-ar", action="store_true",
                        help="also run plain autoregressive decoding (greedy, or the seeded sampler); report the "
                             "speedup and whether the outputs are identical")
    parser.add_argument("--prediction", default=None, metavar="FILE",
                        help="the expected output, as in OpenAI's Predicted Outputs (e.g. the file being edited): "
                             "Goose drafts from it first; the output is the same with it or without it")
    parser.add_argument("--json-schema", default=None, metavar="FILE",
                        help="structured output: the output is JSON following this JSON schema file (with --prompts: "
                             "every prompt's)")
    parser.add_argument("--json-object", action="store_true",
                        help="structured output: the output is a JSON object (JSON mode)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of text (with --prompts: one per line, in input order)")
    parser.add_argument("--logprobs", type=int, default=None, metavar="K",
                        help="with --json: every new token's log probability under the target's raw distribution "
                             "and its K most likely alternatives (0-20), in a 'logprobs' list")
    parser.add_argument("--profile", action="store_true", help="time each phase of the Goose cycle")
    parser.set_defaults(run=_run_generate)


def _read_prediction(path: str | None) -> str | None:
    """The --prediction file's text (- reads stdin); a one-line error when it cannot be read or is empty."""
    if path is None:
        return None
    if path == "-":
        text = sys.stdin.read()
    else:
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"--prediction: cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
    if not text:
        raise ValueError(f"--prediction: {path} is empty: give the expected output, or leave the flag out")
    return text


def _structured_output(args: argparse.Namespace) -> dict[str, Any]:
    """The decoder options of --json-schema FILE / --json-object; a one-line error for a file that is not JSON."""
    if args.json_schema is None:
        return {"json_object": True} if args.json_object else {}
    if args.json_object:
        raise ValueError("give --json-schema or --json-object, not both")
    try:
        with open(args.json_schema, encoding="utf-8") as file:
            return {"json_schema": json.load(file)}
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--json-schema: cannot read {args.json_schema}: "
                         f"{getattr(error, 'strerror', None) or error}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"--json-schema: {args.json_schema} is not JSON: {error}") from None


def _run_generate(args: argparse.Namespace) -> int:
    """goose generate: one prompt (its text streamed as it is decoded) or --prompts FILE, through one session."""
    import time

    from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder
    from goose.cycle.sampling import random_seed

    if (args.prompt is None) == (args.prompts is None):
        raise ValueError("give a prompt or --prompts FILE (one of them)")
    _check_logprobs(args)
    requests = [item | _structured_output(args) | ({"logprobs": args.logprobs} if args.logprobs is not None else {})
                for item in _requests(args)]  # before the model loads: a bad request fails at once
    config = decoding_config(args)
    if config.temperature > 0:  # every request its own seed, reported, so its AR reference can draw the same
        for item in requests:
            item.setdefault("seed", config.seed if config.seed is not None else random_seed())
    model, tokenizer = load_model(args)
    goose = GooseDecoder(model, tokenizer, config, chat=not args.no_chat, profile=args.profile)
    baseline = (AutoregressiveDecoder(model, tokenizer, chat=not args.no_chat, sampling=config.sampling_params())
                if args.compare_ar else None)
    session = goose.batch(args.max_batch or len(requests))
    if baseline is not None:  # warm both up so the timed runs pay no one-off costs
        warm_up = {k: v for k, v in requests[0].items() if k in ("json_schema", "json_object")}
        baseline.generate(requests[0]["prompt"], 4, **warm_up)
        session.submit(goose.request(requests[0]["prompt"], 4, **warm_up))
        list(session.run())
        session.pass_rows.clear()
    ids = [session.submit(goose.request(**item)) for item in requests]
    live = args.prompts is None and not args.json and baseline is None  # one prompt's text, as it is decoded
    results, started = {}, time.perf_counter()
    for chunk in session.run():
        if live:
            print(chunk.text, end="", flush=True)
        if chunk.result is not None:
            results[chunk.request_id] = chunk.result
    wall_s = time.perf_counter() - started
    reports = [_with_token_text(results[request_id].to_dict(), tokenizer) for request_id in ids]
    ar_wall_s = 0.0
    if baseline is not None:  # each request against its own autoregressive run (constrained for a constrained one)
        for item, report in zip(requests, reports, strict=True):
            ar = baseline.generate(**{k: v for k, v in item.items() if k != "prediction"})
            ar_wall_s += ar.stats.wall_s
            report |= {"ar_new_token_ids": ar.new_token_ids, "ar_tokens_per_s": round(ar.stats.tokens_per_s, 3),
                       "ar_prefill_s": round(ar.stats.prefill_s, 4),  # time to first token, as prefill_s is Goose's
                       "speedup": round(report["tokens_per_s"] / ar.stats.tokens_per_s, 3)
                       if ar.stats.tokens_per_s else None,
                       "identical_to_ar": ar.new_token_ids == report["new_token_ids"]}
    def described(request: dict[str, Any]) -> dict[str, Any]:  # the configuration a report row came from
        return {"model": args.model, "engine": args.engine, "dtype": args.dtype, "quantize": args.quantize,
                "sources": list(goose.source_names(with_prediction="prediction" in request)),
                "topology": config.topology, "budget": config.budget, "source_options": config.source_options,
                "changed": config.digest()["changed"], "temperature": config.temperature, "top_p": config.top_p,
                "top_k": config.top_k}

    if args.prompts is None:
        report = {**described(requests[0]), **reports[0]}
        print(json.dumps(report) if args.json else "" if live else reports[0]["text"])
        if not args.json:
            print(_stats_line(report), file=sys.stderr)
        return 0
    for index, report in enumerate(reports):
        print(json.dumps({"index": index, **described(requests[index]), **report}) if args.json
              else f"--- [{index}] ---\n{report['text']}")
    tokens = sum(report["new_tokens"] for report in reports)
    line = (f"[goose] {len(reports)} prompts, up to {session.max_batch} at once: {tokens} tokens in {wall_s:.2f} s "
            f"({tokens / wall_s:.1f} tok/s in all), mean rows per pass "
            f"{sum(session.pass_rows) / max(1, len(session.pass_rows)):.1f}")
    if baseline is not None:
        same = sum(report["identical_to_ar"] for report in reports)
        line += (f"; AR one at a time {tokens / ar_wall_s:.1f} tok/s -> {ar_wall_s / wall_s:.2f}x, "
                 f"{same} of {len(reports)} identical")
    print(line, file=sys.stderr)
    return 0


def _requests(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The requests to decode: --prompts FILE's lines, or the one prompt (- reads stdin) with its --prediction."""
    from goose.cycle.decoder import check_request

    if args.prompts is not None:
        if args.prediction is not None:
            raise ValueError("--prediction goes with one prompt; give each line of --prompts its own 'prediction'")
        if args.max_batch is not None and args.max_batch < 1:
            raise ValueError(f"--max-batch must be at least 1, got {args.max_batch}")
        return _read_prompts(args.prompts, args.max_new_tokens)
    if args.max_batch is not None:
        raise ValueError("--max-batch goes with --prompts")
    if args.prompt == "-" and args.prediction == "-":
        raise ValueError("--prediction - and the prompt - cannot both come from stdin")
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    check_request(prompt, args.max_new_tokens)
    prediction = _read_prediction(args.prediction)
    return [{"prompt": prompt, "max_new_tokens": args.max_new_tokens,
             **({"prediction": prediction} if prediction is not None else {})}]


def _check_logprobs(args: argparse.Namespace) -> None:
    """--logprobs: a count the decoder takes, printed only in the JSON report."""
    from goose.cycle.logprobs import MAX_TOP_LOGPROBS

    if args.logprobs is None:
        return
    if not args.json:
        raise ValueError("--logprobs goes with --json (the log probabilities are printed in the JSON report)")
    if not 0 <= args.logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"--logprobs must be from 0 to {MAX_TOP_LOGPROBS}, got {args.logprobs}")


def _with_token_text(report: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """The report with each log probability entry's token text beside its id (for a reader of the JSON)."""
    def named(item: dict[str, Any]) -> dict[str, Any]:
        return {"token_id": item["token_id"], "token": tokenizer.decode([item["token_id"]], skip_special_tokens=False),
                **item}

    if "logprobs" in report:
        report["logprobs"] = [{**named(entry), "top_logprobs": [named(top) for top in entry["top_logprobs"]]}
                              for entry in report["logprobs"]]
    return report


_LINE_FIELDS = {"prompt": str, "max_new_tokens": int, "prediction": str, "seed": int}


def _read_prompts(path: str, default_tokens: int) -> list[dict[str, Any]]:
    """The --prompts JSONL file's requests; a one-line error naming the line of the first bad one."""
    if path == "-":
        lines = sys.stdin.read().splitlines()
    else:
        try:
            with open(path, encoding="utf-8") as file:
                lines = file.read().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"--prompts: cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
    from goose.cycle.decoder import check_request

    requests = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"--prompts: {path} line {number} is not JSON: {error.msg}") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise ValueError(f"--prompts: {path} line {number} needs a 'prompt' string")
        for key, value in item.items():
            kind = _LINE_FIELDS.get(key)
            if kind is None:
                raise ValueError(f"--prompts: {path} line {number}: unknown field {key!r} "
                                 f"(known: {', '.join(_LINE_FIELDS)})")
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"--prompts: {path} line {number}: {key!r} must be {kind.__name__}")
        item.setdefault("max_new_tokens", default_tokens)
        try:
            check_request(item["prompt"], item["max_new_tokens"])
        except ValueError as error:
            raise ValueError(f"--prompts: {path} line {number}: {error}") from None
        requests.append(item)
    if not requests:
        raise ValueError(f"--prompts: {path} holds no prompt")
    return requests


def _stats_line(report: dict[str, Any]) -> str:
    acceptance = ", ".join(f"{name} {rate:.2f}" for name, rate in report["source_acceptance"].items())
    line = (f"[goose] {report['new_tokens']} tokens in {report['wall_s']:.2f} s ({report['tokens_per_s']:.1f} tok/s), "
            f"tau {report['tau']:.2f} over {report['verify_steps']} verify steps"
            + (f"; acceptance {acceptance}" if acceptance else "")
            + (f"; sampled, seed {report['seed']}" if report.get("seed") is not None else ""))
    checked = report["accepted_prediction_tokens"] + report["rejected_prediction_tokens"]
    if checked:
        line += f"; prediction {report['accepted_prediction_tokens']} of {checked} checked tokens kept"
    if "grammar_s" in report:
        line += (f"; grammar {1e3 * report['grammar_s'] / max(1, report['verify_steps']):.2f} ms per cycle, "
                 f"{report['grammar_cut_tokens']} drafted tokens cut")
    if "speedup" in report:
        verdict = "identical" if report["identical_to_ar"] else "DIFFERENT from AR"
        line += f"; AR {report['ar_tokens_per_s']:.1f} tok/s -> {report['speedup']:.2f}x, {verdict}"
    if "profile_s" in report:
        total = sum(report["profile_s"].values()) or 1.0
        line += "; cycle time " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in report["profile_s"].items())
    return line


# --- goose plugins ------------------------------------------------------------------------------


def _add_plugins(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object (every plugin's hooks included)")
    parser.add_argument("--hooks", action="store_true",
                        help="under each plugin, the hooks its class implements (goose_ prefix left out)")
    parser.set_defaults(run=_run_plugins)


def _run_plugins(args: argparse.Namespace) -> int:
    from goose.config import GooseConfig

    known = registry()
    defaults = GooseConfig()
    rows = [
        {"name": r.name, "kind": r.kind, "origin": r.origin,
         "state": ("enabled" if (r.name in defaults.sources if r.kind == "source" else r.name == defaults.topology)
                   else "available"),
         "description": r.description,
         **({"initial_acceptance": r.initial_acceptance, "shareable": r.shareable} if r.kind == "source" else {}),
         # empty for a factory function: its hooks are known once it has made an instance
         "hooks": list(signatures := known.signatures(r)),
         "hook_arguments": {hook: list(arguments) for hook, arguments in signatures.items()}}
        for table in (known.sources, known.topologies, known.commands) for r in table.values()
    ]
    if args.json:
        print(json.dumps({"plugins": rows, "load_errors": known.load_errors}))
        return 0
    name_width = max((len(r["name"]) for r in rows), default=4)
    origin_width = max((len(r["origin"]) for r in rows), default=6)
    for row in rows:
        print(f"{row['name']:<{name_width}}  {row['kind']:<8}  {row['state']:<9}  {row['origin']:<{origin_width}}  "
              f"{row['description']}")
        if args.hooks:
            hooks = ", ".join(f"{hook.removeprefix('goose_')}({', '.join(arguments)})"
                              for hook, arguments in row["hook_arguments"].items()) or "(made by a function)"
            print(f"{'':<{name_width}}  hooks: {hooks}")
    for problem in known.load_errors:
        print(f"! {problem}", file=sys.stderr)
    return 0


# --- goose calibrate ----------------------------------------------------------------------------


def _add_calibrate(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, dtype="bfloat16")
    parser.add_argument("--refresh", action="store_true", help="measure again instead of using the cached curve")
    parser.add_argument("--show", action="store_true",
                        help="print the curve cached for this model, dtype, threads and CPU (file, when, CPU, spread) "
                             "without measuring; exit status 1 when there is none")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", default=None, metavar="PNG",
                        help="also draw the curve, t(n) / t(1) against tree nodes, into this PNG file")
    parser.set_defaults(run=_run_calibrate)


def _run_calibrate(args: argparse.Namespace) -> int:
    import statistics

    from goose.cycle import calibration
    from goose.planning import cost

    if args.show and args.refresh:
        raise ValueError("--show prints the cached curve and --refresh measures a new one: give one of them")
    model, _ = load_model(args)
    path = cost.curve_path(model)
    if args.show:
        if not path.exists():
            print(f"goose: no verify cost curve is cached for {args.model} ({weights(args)}, {args.device}) with "
                  f"these threads on this CPU ({path}); `goose calibrate` without --show measures it", file=sys.stderr)
            return 1
        curve = cost.CostCurve.load(path)
    else:
        curve = calibration.load_or_measure(model, refresh=args.refresh)
    cached = not (curve.meta and curve.meta.problems)  # a curve that looked busy every time: cached with its signs
    signs = cost.busy_signs(curve) if cached else list(curve.meta.problems)
    if args.plot:
        _plot_curve(curve.sizes, curve.seconds, f"{args.model} ({weights(args)}, {args.device})", Path(args.plot))
    if args.json:
        print(json.dumps({"model": args.model, "dtype": args.dtype, "quantize": args.quantize, "device": args.device,
                          "key": cost.cache_key(model), "path": str(path), "cached": cached, "busy_signs": signs,
                          **curve.to_dict(), "relative": curve.relative()}))
        return 0 if cached else 1
    meta = curve.meta
    context = meta.context_length if meta and meta.context_length else calibration.CALIBRATION_CONTEXT
    print(f"verify cost t(n) for {args.model} ({weights(args)}, {args.device}, {context}-token context)")
    print(f"file      {path}{'' if cached else ' (measured on a busy machine: a quiet run measures it again)'}")
    if meta is None or not meta.measured_at:
        print("measured  (not recorded: a file of sizes and seconds alone)")
    else:
        load = "" if meta.load_average is None else f", load average {meta.load_average:.2f} before"
        tries = f", {meta.tries} measurements" if meta.tries > 1 else ""
        print(f"measured  {meta.measured_at}{load}, {meta.rounds} passes a size{tries}")
        features = f" ({meta.cpu_features}; key {meta.cpu_key})" if meta.cpu_key else ""
        print(f"cpu       {meta.cpu}{features}, {meta.threads} threads")
        if meta.spread:
            worst = max(range(len(meta.spread)), key=meta.spread.__getitem__)
            print(f"spread    IQR/median {statistics.median(meta.spread):.3f} (median over sizes), at most "
                  f"{meta.spread[worst]:.3f} (n = {curve.sizes[worst]})")
        if meta.note:
            print(f"note      {meta.note}")
    print(f"checks    {'; '.join(signs) if signs else 'no sign of a busy machine'}"
          f"{' (the next run measures it again)' if signs and cached else ''}")
    spread = meta.spread if meta and len(meta.spread) == len(curve.sizes) else None
    print(f"{'tree nodes':>10}  {'ms':>8}  {'x one token':>11}{'  spread' if spread else ''}")
    for index, (size, seconds) in enumerate(zip(curve.sizes, curve.seconds, strict=True)):
        print(f"{size:>10}  {1000 * seconds:>8.2f}  {seconds / curve.seconds[0]:>11.2f}"
              f"{f'  {spread[index]:>6.3f}' if spread else ''}")
    return 0 if cached else 1


def _plot_curve(sizes: Sequence[int], seconds: Sequence[float], title: str, path: Path) -> None:
    """``--plot``: t(n) / t(1) against tree nodes (matplotlib, the ``bench`` extra; Agg: files only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(sizes, [s / seconds[0] for s in seconds], marker="o")
    axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xlabel("tree nodes verified in one pass")
    axes.set_ylabel("cost over one token")
    axes.set_title(f"{title}: t(1) = {1000 * seconds[0]:.0f} ms")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


@hookimpl
def goose_register_commands(register: Register) -> None:
    register("generate", _add_generate,
             description="generate text with Goose (optionally side by side with plain greedy decoding)")
    register("plugins", _add_plugins, description="list every registered source, topology and command")
    register("calibrate", _add_calibrate,
             description="measure (or show the cached) verify cost curve t(n) of a model on this device")


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["USER_ERRORS", "add_decoding_arguments", "add_model_arguments", "add_prompt_arguments",
           "add_sampling_arguments", "add_tree_arguments", "build_parser", "check_engine", "decoding_config",
           "goose_register_commands", "load_model", "main", "parse_budget", "weights"]
