"""Summary -> ``report.md``: the paper's tables, from whatever methods the run had.

Tables appear only when their methods ran: speedup / tau per dataset (every method, with the
bootstrap interval of the mean speedup over prompts), the plugins that faulted (the source, its
fault count and first message), speedup over Hugging Face greedy (the peers' yardstick), llama.cpp's
tok/s beside ours (``goose bench llama``; with several GGUF files, each beside the first file's plain
llama.cpp), topology (spine vs Iso(3)/Iso(5) at equal sources and
budget), synergy (Goose over the best standalone source), per-source acceptance with the
heterogeneity ratio p_s/p_t, accepted-path kinds, ablations, sweeps; then what did not run and the
exact configuration of every method.

One estimate per method: with ``--cost-curve`` it is the priced one (every sample's verify passes
priced on the named curve, over ``ar``'s priced the same way: ``estimated_speedup``), in the
estimate table and the three-source study alike; without it the study's prediction from this
device's curve. The measured speedup (the clock) is the main table's, in every table that shows it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from goose_bench.aggregate import ALL, Row, lookup
from goose_bench.methods import TOPOLOGY_BASELINES
from goose_bench.prompts import DATASET_TITLES
from goose_bench.study import REFERENCE, default_sources

# the paper's p_s and p_t: the acceptance of the default Goose's spine source and of its branches' source
SPINE_SOURCE, BRANCH_SOURCE = default_sources()[:2]
PATH_KINDS = ("pure_spine", "spine_continuation", "pure_branch", "bonus_only")
DASH = "–"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else DASH


def _f(value: float | None, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if value is not None else DASH


def _pct(value: float | None) -> str:
    return f"{value:+.1%}" if value is not None else DASH


def _share(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else DASH


def _gain(value: float | None, base: float | None) -> float | None:
    return value / base - 1 if value is not None and base else None


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def _ci(interval: Sequence[float] | None) -> str:
    return f"{interval[0]:.2f}–{interval[1]:.2f}x" if interval else DASH


def _curve_name(curve: dict[str, Any], settings: dict[str, Any] | None = None) -> str:
    """The ``--cost-curve`` a run priced its passes on, by name: a curve file's path, or this device's."""
    if curve["curve"] != "device":
        return f"`{curve['curve']}`"
    cpu = (settings or {}).get("cpu")
    return "this device's measured curve" + (f" ({cpu})" if cpu else "")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _title(dataset: str) -> str:
    return DATASET_TITLES.get(dataset, dataset)


class _View:
    """One model's summary, with the lookups every table needs."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self.summary = summary
        self.rows: list[Row] = summary["results"]
        self.methods = list(dict.fromkeys(row["method"] for row in self.rows))
        self.datasets = list(dict.fromkeys(row["dataset"] for row in self.rows if row["dataset"] != ALL))
        self.meta: dict[str, dict[str, Any]] = summary.get("methods", {})

    def row(self, method: str, dataset: str) -> Row | None:
        return lookup(self.rows, method, dataset)

    def value(self, method: str, dataset: str, key: str) -> Any:
        row = self.row(method, dataset)
        return row.get(key) if row is not None else None

    def present(self, names: Sequence[str]) -> list[str]:
        return [name for name in names if name in self.methods]

    def group(self, prefix: str) -> list[str]:
        return [m for m in self.methods if str(self.meta.get(m, {}).get("group", "")).startswith(prefix)]

    def per_dataset(self, cell: Callable[[str], str]) -> list[str]:
        return [cell(dataset) for dataset in self.datasets]


def _header(view: _View) -> str:
    s = view.summary
    settings = s.get("settings", {})
    facts = [f"model **{s['model']}**", f"device {s['device']}", f"dtype {s['dtype']}"]
    if settings.get("quantize"):
        facts.append(f"linear layers in {settings['quantize']}")
    for key, label in (("max_new_tokens", "max new tokens"), ("limit", "prompts per dataset"),
                       ("threads", "torch threads"), ("torch", "torch"), ("transformers", "transformers"),
                       ("cpu", "cpu"), ("started", "started")):
        if settings.get(key) is not None:
            facts.append(f"{label} {settings[key]}")
    samples = ", ".join(f"{_title(d)} {view.value('ar', d, 'samples') or 0}" for d in view.datasets)
    text = f"## {s['model']}\n\n" + "; ".join(facts) + "."
    if samples:
        text += f"\n\nSamples: {samples}. Speedup = tokens/s over `ar` (Goose's own greedy loop) on the same prompt, "
        text += "mean of per-sample speedups; tau = accepted tokens per verification call (bonus included)."
        memo = settings.get("memo") or {}
        if memo.get("folder"):
            totals = memo.get("totals") or {}
            text += (f" Our methods verified through the target's memo ({memo['folder']}): of the rows they "
                     f"verified, {totals.get('answered_rows', 0)} were read and {totals.get('computed_rows', 0)} "
                     f"computed ({totals.get('passes', 0)} passes, {totals.get('prefills', 0)} prefills), so the "
                     "clock timed the drafting and the little that ran: the speed of each method is its passes "
                     "priced on the curve below, and the clock's columns are left empty (`--no-memo` times every "
                     "pass for real).")
        elif memo.get("off"):
            text += f" Every pass ran for real ({memo['off']})."
        if (settings.get("repeats") or 1) > 1:
            text += (f" Every method ran {settings['repeats']} times on every prompt; each figure is from the run "
                     "with the median wall time.")
    return text


def _main_table(view: _View) -> str:
    through_memo = bool((view.summary.get("settings", {}).get("memo") or {}).get("folder"))  # no clock to read
    rows = []
    for method in view.methods:
        cells = view.per_dataset(lambda d, m=method: f"{_x(view.value(m, d, 'speedup'))} / "
                                                    f"{_f(view.value(m, d, 'tau'))}")
        identical = view.value(method, ALL, "identical_to_ar")
        flag = " (!)" if view.value(method, ALL, "ratios_disagree") else ""
        rows.append([f"`{method}`", *cells, _x(view.value(method, ALL, "speedup")) + flag,
                     _ci(view.value(method, ALL, "speedup_ci")),
                     _x(view.value(method, ALL, "speedup_of_sums")), _f(view.value(method, ALL, "tau")),
                     _f(None if through_memo else view.value(method, ALL, "tokens_per_s"), 1), _share(identical)])
    header = ["method", *(_title(d) for d in view.datasets), "mean speedup", "95% CI", "summed tok/s over ar",
              "mean tau", "tok/s", "identical to AR"]
    text = "### Speedup / tau per dataset\n\n" + _table(header, rows)
    text += ("\n\n95% CI: percentile bootstrap interval of the mean speedup over prompts (2000 resamples of the "
             "prompts within each dataset, a fixed seed; – with fewer than two prompts).")
    if any(view.value(m, ALL, "ratios_disagree") for m in view.methods):
        text += ("\n\n(!) the mean of per-prompt ratios and the ratio of summed tokens/s disagree (either side of 1x, "
                 "or more than 10% apart): a few prompts carry the mean; see the spread below.")
    return text


def _faults_table(view: _View) -> str | None:
    """Every plugin whose hooks faulted (the boundary skipped the call and decoding went on without it): how often,
    on how many samples, in which hooks, and its first message."""
    rows = []
    for method in view.methods:
        for dataset in [*view.datasets, ALL] if len(view.datasets) > 1 else [ALL]:
            row = view.row(method, dataset)
            for name, entry in ((row or {}).get("faults") or {}).items():
                hooks = ", ".join(f"{hook} {count}" for hook, count in entry.get("hooks", {}).items())
                rows.append([f"`{method}`", _title(dataset) if dataset != ALL else "**all**",
                             f"`{name}` ({entry.get('kind', 'source')})", str(entry["count"]),
                             f"{entry.get('samples', 0)}/{row['samples']}", hooks,
                             json.dumps(entry.get("first") or "")[1:-1].replace("|", "\\|")])
    if not rows:
        return None
    return ("### Plugin faults\n\nEvery source or topology whose hooks raised or answered malformed: the plugin "
            "boundary skipped the call and decoding went on without its contribution (the output is unchanged; its "
            "drafts, and so its acceptance and speedup, are not). Faults summed over the samples, the samples with "
            "any, per hook, and the first message.\n\n"
            + _table(["method", "dataset", "plugin", "faults", "samples", "hooks", "first message"], rows))


def _spread_table(view: _View) -> str | None:
    """Per method and dataset: the per-prompt spread, both ratios, and the spread over --repeats."""
    rows = []
    for method in view.methods:
        if method == "ar":
            continue
        for dataset in [*view.datasets, ALL]:
            row = view.row(method, dataset)
            if row is None or row.get("speedup_spread") is None:
                continue
            low, middle, high = row["speedup_spread"]
            repeats = row.get("repeat_spread")
            rows.append([f"`{method}`", _title(dataset) if dataset != ALL else "**all**", str(row["samples"]),
                         f"{low:.2f}x / {middle:.2f}x / {high:.2f}x", _x(row.get("speedup")),
                         _x(row.get("speedup_of_sums")), "(!)" if row.get("ratios_disagree") else "",
                         f"{repeats[0]:.0%} / {repeats[1]:.0%}" if repeats else DASH])
    if not rows:
        return None
    return ("### Spread over prompts (speedup over `ar`)\n\nPer prompt min / median / max; the mean of per-prompt "
            "ratios beside the ratio of summed tokens/s on the same prompts; with `--repeats`, how far one method's "
            "runs on one prompt lay apart (slowest / fastest - 1: median / largest).\n\n"
            + _table(["method", "dataset", "prompts", "min / median / max", "mean of ratios", "ratio of sums",
                      "disagree", "repeats apart"], rows))


def _estimate_table(view: _View) -> str | None:
    """Speedups a cost curve implies for the passes each method needed: the deterministic mode's (--cost-curve, the
    memo's), or, where every pass ran for real, the same passes priced on the run's own curve beside the clock."""
    settings = view.summary.get("settings", {})
    curve = settings.get("priced_on") or settings.get("priced_beside")
    if not curve:
        return None
    beside = not settings.get("priced_on")

    def spread(m: str) -> str:
        found = view.value(m, ALL, "estimated_speedup_spread")
        return " / ".join(f"{value:.3f}x" for value in found) if found else DASH

    rows = [[f"`{m}`", *view.per_dataset(lambda d, m=m: f"{_x(view.value(m, d, 'estimated_speedup'))} / "
                                                        f"{_f(view.value(m, d, 'tau'))}"),
             _x(view.value(m, ALL, "estimated_speedup")), _ci(view.value(m, ALL, "estimated_speedup_ci")), spread(m),
             str(view.value(m, ALL, "passes")), str(view.value(m, ALL, "rows")),
             _share(view.value(m, ALL, "identical_to_ar"))]
            for m in view.methods if view.value(m, ALL, "estimated_speedup") is not None]
    relative = ", ".join(f"{n}: {t / curve['seconds'][0]:.2f}" for n, t in zip(curve["sizes"], curve["seconds"],
                                                                               strict=True))
    name = _curve_name(curve, settings)
    header = ["method", *(_title(d) for d in view.datasets), "mean estimate", "95% CI", "per prompt min / median / max",
              "passes", "rows", "identical to AR"]
    if beside:
        return (f"### The same passes priced on {name}, beside the clock\n\n"
                "Every pass of this run ran for real, and the tables above time them. Here each sample's verify "
                f"passes are priced on {name}, the curve the run calibrated and planned on (t(n) / t(1): {relative}; "
                f"t(1) {1e3 * curve['seconds'][0]:.1f} ms), a token each, over `ar`'s priced the same way on the same "
                "prompt; prefill and host time left out on both sides. A prompt's figure does not move with the "
                "machine's load: it is what the trees cost by the rule the planner lays them by (no tree the curve "
                "says loses), so a prompt well under 1.00x here is a tree that lost, and one under 1.00x on the "
                "clock alone is the clock.\n\n" + _table(header, rows))
    return (f"### Estimated speedup on {name} (an estimate, not a clock)\n\n"
            f"Every sample's verify passes priced on {name} (t(n) / t(1): {relative}; t(1) "
            f"{1e3 * curve['seconds'][0]:.1f} ms), over `ar`'s passes priced the same way on the same prompt, a token "
            "each; prefill and host time left out on both sides. In float32 every lossless method decodes `ar`'s "
            "text, so this ranks drafting without the clock's noise. This is the run's one estimate per method (the "
            "three-source study shows the same figure). Passes and rows: every verify pass of every sample, and the "
            "rows they held (the tree's and the auxiliary rows), whether run or read from the memo.\n\n"
            + _table(header, rows))


def _peer_table(view: _View) -> str | None:
    if "hf_ar" not in view.methods:
        return None
    rows = [[f"`{m}`", *view.per_dataset(lambda d, m=m: _x(view.value(m, d, "speedup_vs_hf_ar"))),
             _x(view.value(m, ALL, "speedup_vs_hf_ar"))] for m in view.methods]
    ar_speed = ["HF AR tok/s", *view.per_dataset(lambda d: _f(view.value("hf_ar", d, "tokens_per_s"), 1)), ""]
    header = ["method", *(_title(d) for d in view.datasets), "mean"]
    return ("### Speedup over Hugging Face `generate` (the peer users call)\n\n"
            + _table(header, [ar_speed, *rows]))


def _lookup_table(view: _View) -> str | None:
    if "hf_pld" not in view.methods:
        return None

    def cell(method: str, dataset: str) -> str:
        span = view.value(method, dataset, "speedup_vs_hf_pld_range")
        spread = f" ({span[0]:.2f}-{span[1]:.2f})" if span else ""
        return _x(view.value(method, dataset, "speedup_vs_hf_pld")) + spread

    rows = [[f"`{m}`", *view.per_dataset(lambda d, m=m: cell(m, d)), _x(view.value(m, ALL, "speedup_vs_hf_pld"))]
            for m in view.methods if m != "hf_pld"]
    header = ["method", *(_title(d) for d in view.datasets), "mean"]
    return ("### Speedup over Hugging Face prompt lookup (`hf_pld`)\n\nPer prompt, tokens/s over `hf_pld`'s on the "
            "same prompt; mean over the dataset's prompts (min-max).\n\n" + _table(header, rows))


def _first_token_table(view: _View) -> str | None:
    base = view.value("ar", ALL, "first_token_s")
    rows = [[f"`{m}`", *view.per_dataset(lambda d, m=m: _f(view.value(m, d, "first_token_s"), 3)),
             _f(view.value(m, ALL, "first_token_s"), 3), _x(_ratio(view.value(m, ALL, "first_token_s"), base))]
            for m in view.methods if view.value(m, ALL, "first_token_s") is not None]
    if not rows:
        return None
    header = ["method", *(_title(d) for d in view.datasets), "median", "vs `ar`"]
    return "### Time to first token (s, median)\n\n" + _table(header, rows)


def _llama_table(view: _View) -> str | None:
    """llama.cpp beside ours (``goose bench llama``): tok/s per prompt, ours over its, how many texts match."""
    llama = view.summary.get("llama")
    if not llama or not llama["prompts"]:
        return None
    c, reference = llama["conditions"], llama["reference"]
    theirs, ours = llama["llama_methods"], llama["our_methods"]
    ratios = [f"{reference}/{m}" for m in theirs]
    header = ["prompt", "prompt tokens", *(f"`{m}` tok/s" for m in [*ours, *theirs]),
              *(f"`{r.replace('/', '` / `')}`" for r in ratios), *(f"`{m}` = `ar`" for m in theirs)]
    rows = []
    for row in llama["prompts"]:
        name = str(row["question_id"])  # HumanEval's ids already name the dataset
        rows.append([name if "/" in name else f"{_title(row['dataset'])} {name}", str(row["prompt_tokens"]),
                     *(_f(row["tokens_per_s"].get(m), 1) for m in [*ours, *theirs]),
                     *(_x(row["ratios"][r]) for r in ratios),
                     *("yes" if row["identical_to_ar"][m] else "no" for m in theirs)])
    count = llama["compared"]
    rows.append(["**median**", "", *(_f(llama["median_tokens_per_s"].get(m), 1) for m in [*ours, *theirs]),
                 *(_x(llama["median_ratios"][r]) for r in ratios),
                 *(f"{llama['identical_to_ar'][m]}/{count}" for m in theirs)])
    ours_decode = (
        "ours decode the same file through llama.cpp too (`--engine llama.cpp`: Goose's trees in one `llama_batch`), "
        f"with the same attention settings in both (flash attention, a bfloat16 V cache: "
        f"`engine_attention={c.get('engine_attention')}`) and ggml's tiled matmul switch "
        f"`GGML_CPU_TILED_MM={c.get('ggml_cpu_tiled_mm')}` in both"
        if llama.get("engine") == "llama.cpp" else
        f"ours decode the dequantized weights in {view.summary['dtype']}, so per token llama.cpp reads about "
        f"{llama['weight_bytes_ratio']:.0%} of the weight bytes we read")
    lines = [
        f"{c['engine']}, `{c['gguf'].rsplit('/', 1)[-1]}` ({c['gguf_bytes'] / 1e6:.0f} MB) as shipped, through its "
        f"quantized kernels; {ours_decode}. {c['threads']} threads, one "
        f"request at a time (llama-cpp-python's `Llama` decodes one sequence), {llama['turns']} (the same token "
        f"ids and EOS ids as ours), greedy, prefill included in every time; `llama_pld`: `LlamaPromptLookupDecoding"
        f"(max_ngram_size={c['max_ngram_size']}, num_pred_tokens={c['num_pred_tokens']})`. "
        + ("Same weights, same kernels: `llama` is ours `ar`'s peer token for token." if llama.get("engine") ==
           "llama.cpp" else "Other weights, other arithmetic: its texts may differ from ours."),
    ]
    if "server" in c:
        lines.append("`llama_server_ngram`: `llama-server " + " ".join(c["server"]["arguments"][2:]) + "` (its own "
                     "build of the same version), a fresh server per run (its ngram pool is shared by all its "
                     "requests), `cache_prompt` off, timed from the request to the whole answer.")
    for method, same in llama.get("identical_to_plain", {}).items():
        lines.append(f"`{method}`'s text equals `llama`'s on {same}/{count} prompts.")
    for method, drafts in llama.get("drafts", {}).items():
        share = f" ({drafts['accepted'] / drafts['drafted']:.0%})" if drafts["drafted"] else ""
        lines.append(f"`{method}` drafted {drafts['drafted']} tokens, {drafts['accepted']} accepted{share}.")
    for ratio in ratios:
        value = llama["median_ratios"][ratio]
        if value is not None:
            shown = round(value, 2)
            faster = (f"`{ratio.split('/')[1]}` is faster" if shown < 1 else f"`{reference}` is faster" if shown > 1
                      else "even")
            lines.append(f"Median `{ratio.replace('/', '` / `')}`: {shown:.2f}x ({faster}).")
    return ("### llama.cpp on the same prompts (tok/s)\n\n" + " ".join(lines) + "\n\n" + _table(header, rows))


def _llama_after_first_table(view: _View) -> str | None:
    """llama.cpp beside ours, the first token and the decoding after it apart: the prefill is the same work on
    both sides (same file, same kernels), so a copy-heavy prompt's long prefill does not hide the decoding."""
    llama = view.summary.get("llama")
    if not llama or not llama["prompts"] or "median_decode_ratios" not in llama:
        return None
    reference, theirs = llama["reference"], llama["llama_methods"]
    methods, ratios = [*llama["our_methods"], *theirs], [f"{llama['reference']}/{m}" for m in theirs]
    header = ["prompt", *(f"`{m}` first token s" for m in methods), *(f"`{m}` tok/s after" for m in methods),
              *(f"`{r.replace('/', '` / `')}` after" for r in ratios),
              *(f"`{r.replace('/', '` / `')}` first token" for r in ratios)]
    rows = []
    for row in llama["prompts"]:
        name = str(row["question_id"])
        rows.append([name if "/" in name else f"{_title(row['dataset'])} {name}",
                     *(_f(row["first_token_s"].get(m), 2) for m in methods),
                     *(_f(row["decode_tokens_per_s"].get(m), 1) for m in methods),
                     *(_x(row["decode_ratios"][r]) for r in ratios),
                     *(_x(row["first_token_ratios"][r]) for r in ratios)])
    rows.append(["**median**", *([""] * (2 * len(methods))), *(_x(llama["median_decode_ratios"][r]) for r in ratios),
                 *(_x(llama["median_first_token_ratios"][r]) for r in ratios)])
    return ("### llama.cpp on the same prompts: the first token and the decoding after it\n\n"
            f"Seconds from the call to the first new token (the prompt's prefill and its token), and tokens per second "
            f"after it; `{reference}`'s over each llama.cpp method's (a first-token ratio at or below 1.00x: "
            f"`{reference}`'s first token came no later).\n\n" + _table(header, rows))


def _llama_files_table(view: _View) -> str | None:
    """Several GGUF files in one ``goose bench llama`` run: each file's ours and llama.cpp plain tok/s, and each over
    the first file's plain llama.cpp: is ours on a re-quantized file faster than plain llama.cpp on the shipped one?"""
    files = view.summary.get("llama_files")
    if not files:
        return None
    plain, entries = files["plain"], files["files"]
    ours = entries[0]["reference"]
    rows = [[f"`{entry['gguf'].rsplit('/', 1)[-1]}`", f"{entry['gguf_bytes'] / 1e6:.0f}",
             *(_f(entry["median_tokens_per_s"].get(m), 1) for m in (ours, plain)),
             *(_x(entry[key].get(m)) for key in ("over_first_plain", "over_first_plain_after_first")
               for m in (ours, plain))] for entry in entries]
    first = f"the first file's `{plain}`"
    header = ["file", "MB", f"`{ours}` tok/s", f"`{plain}` tok/s", f"`{ours}` / {first}", f"`{plain}` / {first}",
              f"`{ours}` / {first}, after the first token", f"`{plain}` / {first}, after the first token"]
    return ("### The GGUF files of this run side by side\n\nMedians over the prompts: each file's tok/s, and per "
            f"prompt its tok/s over `{plain}`'s (llama.cpp's plain decoding) on the first file, "
            f"`{entries[0]['gguf'].rsplit('/', 1)[-1]}`, on the same prompt, whole and after the first token.\n\n"
            + _table(header, rows))


def _topology_table(view: _View) -> str | None:
    isos = view.present(TOPOLOGY_BASELINES)
    if "goose" not in view.methods or not isos:
        return None
    header = ["dataset", "spine (goose)"]
    for iso in isos:
        header += [f"`{iso}`", f"spine vs `{iso}`"]
    rows = []
    for dataset in [*view.datasets, ALL]:
        spine = view.value("goose", dataset, "tau")
        cells = [_title(dataset) if dataset != ALL else "**mean**", _f(spine)]
        for iso in isos:
            tau = view.value(iso, dataset, "tau")
            cells += [_f(tau), _pct(_gain(spine, tau))]
        rows.append(cells)
    return "### Topology at equal sources and budget (tau)\n\n" + _table(header, rows)


def _synergy_table(view: _View) -> str | None:
    """Every method of several sources against the best of its own sources run alone (the standalone rows)."""
    alone: dict[str, str] = {}  # source -> its standalone method
    for method in view.methods:
        config = view.meta.get(method, {}).get("digest") or {}
        if view.meta.get(method, {}).get("kind") == "goose" and len(config.get("sources") or ()) == 1:
            alone.setdefault(config["sources"][0], method)
    combined = [m for m in view.methods if len((view.meta.get(m, {}).get("digest") or {}).get("sources") or ()) > 1
                and any(s in alone for s in view.meta[m]["digest"]["sources"])]
    if not alone or not combined:
        return None
    rows = []
    for method in combined:
        mine = [alone[s] for s in view.meta[method]["digest"]["sources"] if s in alone]
        for dataset in [*view.datasets, ALL]:
            known = {m: t for m in mine if (t := view.value(m, dataset, "tau")) is not None}
            best = max(known, key=lambda m: known[m]) if known else None
            tau = view.value(method, dataset, "tau")
            rows.append([f"`{method}`", _title(dataset) if dataset != ALL else "**mean**",
                         f"`{best}` {_f(known[best])}" if best else DASH, _f(tau),
                         _pct(_gain(tau, known.get(best) if best else None))])
    return ("### Synergy: each combination over the best of its sources alone (tau)\n\n"
            f"Sources alone: {', '.join(f'`{m}` ({s})' for s, m in alone.items())}.\n\n"
            + _table(["method", "dataset", "best source alone", "tau", "gain"], rows))


def _acceptance_table(view: _View) -> str | None:
    methods = [m for m in view.methods if view.value(m, ALL, "source_tested")]
    if not methods:
        return None
    sources = list(dict.fromkeys(s for m in methods for s in view.value(m, ALL, "source_tested")))
    header = ["method", "dataset", *(f"`{s}`" for s in sources), "p_s/p_t"]
    rows = []
    for method in methods:
        for dataset in [*view.datasets, ALL]:
            tested = view.value(method, dataset, "source_tested") or {}
            accepted = view.value(method, dataset, "source_accepted") or {}

            faults = view.value(method, dataset, "faults") or {}

            def cell(source: str, tested: dict = tested, accepted: dict = accepted, faults: dict = faults) -> str:
                n = tested.get(source)
                if n:
                    return f"{accepted.get(source, 0) / n:.3f} ({accepted.get(source, 0)}/{n})"
                if source in faults:
                    return f"not tested: faulted ({faults[source]['count']})"
                return "not tested" if source in tested else DASH

            accept = view.value(method, dataset, "source_acceptance") or {}
            p_s, p_t = accept.get(SPINE_SOURCE), accept.get(BRANCH_SOURCE)
            ratio = f"{p_s / p_t:.1f}x" if p_s is not None and p_t else DASH
            rows.append([f"`{method}`", _title(dataset) if dataset != ALL else "**all**",
                         *(cell(s) for s in sources), ratio])
    return ("### Per-source acceptance: accepted / tested draft nodes\n\n"
            "Every source's draft nodes the target checked and kept, pooled over the dataset's prompts (measured; not "
            f"the running estimates Goose plans with). p_s = `{SPINE_SOURCE}`, p_t = `{BRANCH_SOURCE}`; the paper "
            "measures p_s 0.07–0.60, p_t 0.03–0.05, p_s/p_t 2x–18x. \"not tested\": the source is the method's "
            "but none of its nodes was checked (it drafted nothing, or faulted: see Plugin faults).\n\n"
            + _table(header, rows))


def _path_table(view: _View) -> str | None:
    methods = [m for m in view.methods if view.value(m, ALL, "path_kinds")]
    if not methods:
        return None
    rows = [[f"`{m}`", *(_share((view.value(m, ALL, "path_kinds") or {}).get(k, 0.0)) for k in PATH_KINDS)]
            for m in methods]
    return "### Accepted-path kinds (share of verification steps, all datasets)\n\n" + _table(
        ["method", *PATH_KINDS], rows)


def _category_tables(view: _View) -> str | None:
    rows: list[Row] = view.summary.get("categories") or []
    if not rows:
        return None
    parts = ["### Per category (speedup / tau)"]
    groups = list(dict.fromkeys(row["dataset"] for row in rows))
    for dataset in dict.fromkeys(group.split("/", 1)[0] for group in groups):
        mine = [g for g in groups if g.startswith(dataset + "/")]
        table = []
        for method in view.methods:
            cells = []
            for group in mine:
                row = lookup(rows, method, group)
                cells.append(f"{_x(row['speedup'])} / {_f(row['tau'])}" if row else DASH)
            table.append([f"`{method}`", *cells])
        header = ["method", *(f"{g.split('/', 1)[1]} ({(lookup(rows, 'ar', g) or {}).get('samples', 0)})"
                              for g in mine)]
        parts.append(f"{_title(dataset)}:\n\n" + _table(header, table))
    return "\n\n".join(parts)


def _ablation_table(view: _View) -> str | None:
    ablations = view.group("ablation")
    if not ablations:
        return None
    reference = view.value("goose", ALL, "tau")
    rows = []
    for method in view.present(("goose",)) + ablations:
        tau = view.value(method, ALL, "tau")
        rows.append([f"`{method}`", *view.per_dataset(lambda d, m=method: _f(view.value(m, d, "tau"))), _f(tau),
                     DASH if method == "goose" else _pct(_gain(tau, reference)),
                     _x(view.value(method, ALL, "speedup"))])
    header = ["config", *(_title(d) for d in view.datasets), "mean tau", "change", "mean speedup"]
    return "### Ablations (tau; change of mean tau against `goose`)\n\n" + _table(header, rows)


def _sweep_table(view: _View) -> str | None:
    sweeps = view.group("sweep")
    if not sweeps:
        return None
    rows = [[str(view.meta[m]["group"]).removeprefix("sweep:"), f"`{m}`", _f(view.value(m, ALL, "tau")),
             _x(view.value(m, ALL, "speedup")), _f(view.value(m, ALL, "tokens_per_s"), 1)] for m in sweeps]
    return "### Sensitivity sweeps (mean over datasets)\n\n" + _table(
        ["parameter", "setting", "mean tau", "mean speedup", "tok/s"], rows)


def _unavailable(view: _View) -> str | None:
    missing = view.summary.get("unavailable") or {}
    if not missing:
        return None
    lines = [f"- `{name}`: {reason}" for name, reason in missing.items()]
    return "### Methods that did not run\n\n" + "\n".join(lines)


def _definitions(view: _View) -> str | None:
    if not view.meta:
        return None
    rows = [[f"`{name}`", str(meta.get("kind", "")), f"`{json.dumps(meta.get('digest') or meta.get('fields') or {})}`",
             str(meta.get("description", ""))] for name, meta in view.meta.items()]
    return ("### Method definitions (Goose: sources, topology, budget, options and every other changed field; HF: "
            "generate() arguments)\n\n" + _table(["method", "kind", "config", "description"], rows))


def _study_tables(view: _View) -> str | None:
    """The three-source study: tau per configuration against the two-source spine, yields, one speedup estimate (the
    priced one on --cost-curve's curve, else the prediction from this device's) and the measured speedup."""
    study = view.summary.get("study")
    if not study or not study["rows"]:
        return None
    rows = sorted(study["rows"], key=lambda r: (r["topology"], len(r["sources"]), r["method"]))
    reference = next((r for r in rows if r["method"] == REFERENCE), None)
    datasets = [d for d in view.datasets if any(d in r["tau"] for r in rows)]
    settings = view.summary.get("settings", {})
    curve = settings.get("priced_on")
    # one estimate per configuration: the priced one on --cost-curve's curve (the estimate table's), else the
    # prediction from this device's curve; the measured speedup is the main table's
    estimate = f"est. over `ar` on {_curve_name(curve, settings)}" if curve else \
        "pred. over one token a pass, this device's curve"
    header = ["configuration", *(_title(d) for d in datasets), "mean tau", f"vs {REFERENCE}", estimate,
              "measured", "yield per pass"]
    table = []
    for row in rows:
        gains = [_gain(row["tau"].get(d), reference["tau"].get(d) if reference else None) for d in datasets]
        yields = ", ".join(f"{name} {value:.2f}" for name, value in row["yield_per_pass"].items())
        estimated = view.value(row["method"], ALL, "estimated_speedup") if curve else row["predicted_device"]
        table.append([f"`{row['method']}`", *(_f(row["tau"].get(d)) for d in datasets), _f(row["tau"]["all"]),
                      _pct(_gain(row["tau"]["all"], reference["tau"]["all"] if reference else None))
                      + f" ({sum(g is not None and g >= 0.10 for g in gains)}/{len(datasets)} >= +10%)",
                      _x(estimated), _x(view.value(row["method"], ALL, "speedup")), yields])
    lost: dict[tuple[str, str], list[float]] = {}
    for item in study["tokens_lost_without"]:
        lost.setdefault((item["source"], item["triple"].split("@")[1]), []).append(item["tau_lost"])
    lost_rows = [[f"`{source}`", f"`{topology}`", _f(sum(values) / len(values), 3), str(len(values))]
                 for (source, topology), values in sorted(lost.items())]
    text = ("### Three-source study (equal budget; tau per dataset, one speedup estimate, the measured speedup)\n\n"
            + _table(header, table))
    if lost_rows:
        text += ("\n\n#### Tokens per pass lost without each source (mean over the triples holding it)\n\n"
                 + _table(["source", "shape", "tau lost", "triples"], lost_rows))
    return text


def _differences_table(view: _View) -> str | None:
    """Every output that parts from ``ar``'s: where, and ``ar``'s own two top logits there (goose_bench.mismatch)."""
    found = view.summary.get("differences") or []
    if not found:
        return None
    rows = []
    for item in found:
        where = f"{_title(item['dataset'])} {item['question_id']}" if "/" not in str(item["question_id"]) else \
            str(item["question_id"])
        if "top2_logits" not in item:  # one output only stops earlier or later
            rows.append([f"`{item['method']}`", where, str(item["turn"]), str(item["index"]), DASH, DASH, DASH, DASH])
            continue
        top = item["top2_logits"]
        rows.append([f"`{item['method']}`", where, str(item["turn"]), str(item["index"]),
                     f"{json.dumps(item.get('reference_text'))} / {json.dumps(item.get('text'))}",
                     f"{top[0]:.3f} / {top[1]:.3f}", f"{item['token_gap']:.3f}",
                     str(item["token_rank"] + 1) + ("" if item.get("replayed", True) else " (replay differs)")])
    header = ["method", "sample", "turn", "first differing token", "`ar`'s token / its token",
              "`ar`'s two top logits", "its token's logit below `ar`'s top", "its token's rank under `ar`"]
    return ("### Outputs that differ from `ar`\n\nFor every output that is not `ar`'s, the first token where it "
            "parts and `ar`'s own logits there (replayed: the prompt's prefill, then one token a pass). A token a "
            "few hundredths of a logit below `ar`'s top one, ranked second, is a near-tie that a pass of another "
            "shape rounds the other way.\n\n" + _table(header, rows))


SECTIONS: tuple[Callable[[_View], str | None], ...] = (
    _header, _main_table, _faults_table, _differences_table, _spread_table, _estimate_table, _peer_table, _lookup_table,
    _first_token_table, _llama_table, _llama_after_first_table, _llama_files_table, _topology_table,
    _synergy_table, _acceptance_table, _path_table, _category_tables, _ablation_table, _sweep_table, _study_tables,
    _unavailable, _definitions,
)


def model_report(summary: dict[str, Any]) -> str:
    """The report section of one model's summary."""
    view = _View(summary)
    return "\n\n".join(part for section in SECTIONS if (part := section(view)))


def main_table(summary: dict[str, Any]) -> str:
    """The tables printed at the end of a run: speedup / tau, the plugins that faulted, and the estimate of
    --cost-curve when it ran."""
    view = _View(summary)
    return "\n\n".join(part for part in (_main_table(view), _faults_table(view), _estimate_table(view)) if part)


def build_report(summaries: Sequence[dict[str, Any]], plots: Sequence[str] = ()) -> str:
    """The whole ``report.md``: one section per model, then the plots."""
    parts = ["# Goose benchmark", *(model_report(s) for s in summaries)]
    if plots:
        parts.append("## Plots\n\n" + "\n\n".join(f"![{p}]({p})" for p in plots))
    return "\n\n".join(parts) + "\n"
