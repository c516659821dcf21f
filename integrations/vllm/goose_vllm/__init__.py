"""goose-vllm: Goose's sources drafting inside vLLM, as vLLM's ``custom_class`` speculative proposer
``goose_vllm.GooseProposer`` (:mod:`goose_vllm.proposer`; docs/vllm.md)."""

from goose_vllm.proposer import (
    CONFIG_ENV,
    Chain,
    ChainCut,
    GooseProposer,
    ProposerConfig,
    RequestTable,
    RowDrafter,
    StepCost,
    usable_sources,
)

__all__ = ["CONFIG_ENV", "Chain", "ChainCut", "GooseProposer", "ProposerConfig", "RequestTable", "RowDrafter",
           "StepCost", "usable_sources"]
