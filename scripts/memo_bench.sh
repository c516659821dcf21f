#!/usr/bin/env bash
# The memo's figures (goose_bench.memo): one study three ways, on one machine, one after another, alone:
#   no-memo  every pass for real (--no-memo)
#   first    through a new, empty memo (the methods share what each computed)
#   again    the same study again on that memo (nothing left to compute)
# then checks that the three decoded, drafted and priced the same, record for record.
# Usage: scripts/memo_bench.sh OUT [goose bench MODE flags...]; the defaults are the ablation suite for one source on
# 20 packaged prompts x 64 tokens, SmolLM2 float32:
#   scripts/memo_bench.sh bench-memo
#   STUDY="run --methods goose,cm@chain" scripts/memo_bench.sh bench-memo-qwen --model qwen2.5-coder-1.5b --datasets humaneval
set -euo pipefail
out=${1:?usage: scripts/memo_bench.sh OUT [goose bench MODE flags...]}
shift
goose=${GOOSE:-.venv/bin/goose}
python=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
memo="$out/memo"
rm -rf "$memo"
# STUDY: the mode and its methods (default: the ablation suite for suffix_memory), e.g. STUDY="run --methods goose,cm@chain"
read -r -a study <<< "${STUDY:-suite ablation --sources suffix_memory}"
defaults=("${study[@]}" --dtype float32 --datasets humaneval,gsm8k,mt_bench,structured --limit 5 --max-new-tokens 64
          --cost-curve device --no-progress)
{
    echo "# scripts/memo_bench.sh $out $*"
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
         "flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*\|avx_vnni' | sort -u | xargs)"
    echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/times.txt"
for run in no-memo first again; do
    flags=(--memo "$memo")
    [ "$run" = no-memo ] && flags=(--no-memo)
    started=$(date +%s.%N)
    "$goose" bench "${defaults[@]}" "$@" "${flags[@]}" --out "$out/$run" > "$out/$run.log" 2>&1
    echo "$run $(echo "$(date +%s.%N) - $started" | bc) s (load after: $(cut -d' ' -f1-3 /proc/loadavg))" >> "$out/times.txt"
done
"$python" - "$out" >> "$out/times.txt" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {name: [json.loads(line) for line in (out / name / "results.jsonl").read_text().splitlines()]
        for name in ("no-memo", "first", "again")}
keys = ("new_token_ids", "tree_sizes", "source_tested", "source_accepted", "estimated_speedup")
for name in ("first", "again"):
    same = sum(all(a[k] == b[k] for k in keys) and a["choices"][0]["accept_lengths"] == b["choices"][0]["accept_lengths"]
               for a, b in zip(runs["no-memo"], runs[name], strict=True))
    totals = {}
    for record in runs[name]:
        for key, value in (record.get("memo") or {}).items():
            totals[key] = totals.get(key, 0) + value
    print(f"{name}: {same} of {len(runs[name])} records identical to no-memo (tokens, accepted lengths, tree sizes, "
          f"tested/accepted per source, estimated speedup); memo {totals}")
rows = sum(sum(r["tree_sizes"] or []) for r in runs["no-memo"])
print(f"no-memo: {rows} tree rows verified in {sum(len(r['tree_sizes'] or []) for r in runs['no-memo'])} passes")
EOF
cat "$out/times.txt"
