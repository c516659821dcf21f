"""llama.cpp (llama-cpp-python) scoring fixed token windows: the negative log likelihood of every next token.

Run with the llama.cpp environment; ``scripts/int8_quality.py --llama-python .venv/bin/python``
runs it on the windows its own side scored, so that both engines read the same token ids::

    .venv/bin/python scripts/llama_perplexity.py --gguf FILE.gguf --windows windows.json --out nll.json

``--windows`` is a JSON list of token id lists. Each window is evaluated from an empty KV cache with
``logits_all``, and token i + 1 is scored by the log softmax (float64) of the logits at i. Writes
``{"conditions": ..., "windows": [{"nll": sum, "tokens": count}, ...]}``. Nothing of Goose is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--windows", required=True, help="JSON file: a list of token id lists")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    windows = json.loads(Path(args.windows).read_text())
    size = max(len(window) for window in windows)
    threads = args.threads or os.cpu_count() or 1
    llm = Llama(model_path=args.gguf, n_ctx=size, n_batch=size, n_threads=threads, n_threads_batch=threads,
                logits_all=True, verbose=False)
    scored = []
    for window in windows:
        llm.reset()
        llm.eval(window)
        logits = np.asarray(llm.scores[: len(window) - 1], dtype=np.float64)
        top = logits.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
        targets = np.asarray(window[1:])
        nll = float((log_norm - logits[np.arange(targets.shape[0]), targets]).sum())
        scored.append({"nll": nll, "tokens": int(targets.shape[0])})
        print(f"  window of {len(window)} tokens: perplexity {np.exp(nll / targets.shape[0]):.4f}", flush=True)
    conditions = {"engine": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}", "gguf": str(Path(args.gguf)),
                  "threads": threads}
    Path(args.out).write_text(json.dumps({"conditions": conditions, "windows": scored}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
