"""A source that raises inside vLLM's engine costs drafts, never output: one log line, same tokens."""

from __future__ import annotations

import json

from tests.vllm.conftest import generate, goose_speculation, spec_counters, start_llm, stop
from tests.vllm.faulty_source import MESSAGE, NAME


def test_a_failing_source_leaves_the_output_unchanged(model_path, prompts, reference, capfd):
    config = json.dumps({"sources": [NAME, "context_match"], "plugins": ["tests.vllm.faulty_source"]})
    llm = start_llm(model_path, goose_speculation(), goose_config=config)
    try:
        outputs = generate(llm, prompts)
        counters = spec_counters(llm)
    finally:
        stop(llm)
    assert outputs == reference
    assert counters["accepted_tokens"] > 0  # context match still drafts beside the failing source
    captured = capfd.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if MESSAGE in line]
    assert len(lines) == 1, f"expected one log line about the fault, got {lines}"
    assert f"source {NAME!r} skipped in goose_propose" in lines[0]
