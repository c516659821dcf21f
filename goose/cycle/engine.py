"""The engines a decoder verifies on, behind one verifier interface.

``torch``: a Hugging Face model and :class:`goose.cycle.verifier.Verifier` (tree attention masks over
transformers' ``Cache``). ``llama.cpp``: a GGUF file as shipped, :class:`goose.llama_model.LlamaModel`,
and :class:`goose.cycle.llama_verifier.LlamaVerifier` (trees as llama.cpp sequences). The session,
sources, topologies, planner and walker are the same for both: they see a :class:`Verifying`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from goose.contract.candidates import eos_token_ids
from goose.contract.outcome import AuxiliaryRows
from goose.contract.tree import DraftTree
from goose.cycle.verifier import Verifier
from goose.llama_model import LlamaModel


class Verifying(Protocol):
    """What the cycle asks of a verifier (both engines' verifiers have it)."""

    model: Any
    slots: int
    vocab_size: int
    max_positions: int

    @property
    def lengths(self) -> list[int]: ...

    @property
    def live(self) -> int: ...

    def check_fits(self, positions: int) -> None: ...

    def full(self) -> list[int]: ...

    def room(self) -> list[int]: ...

    def prefill(self, prompt_ids: list[int], logits_to_keep: int = 1) -> torch.Tensor: ...

    def verify(self, trees: Sequence[DraftTree], auxiliary: Sequence[Sequence[AuxiliaryRows]] | None = None
               ) -> list[torch.Tensor]: ...

    def commit(self, slot: int, path: np.ndarray) -> None: ...

    def release(self, slot: int) -> int | None: ...

    def reset(self) -> None: ...


def new_verifier(model: Any, slots: int = 1, cache_positions: int | None = None) -> Verifying:
    """The verifier of ``model``'s engine, holding up to ``slots`` requests."""
    if isinstance(model, LlamaModel):
        from goose.cycle.llama_verifier import LlamaVerifier

        return LlamaVerifier(model, slots, cache_positions)
    return Verifier(model, slots, cache_positions)


def model_device(model: Any) -> torch.device:
    """Where ``model``'s logits live (llama.cpp's: in host memory)."""
    return torch.device("cpu") if isinstance(model, LlamaModel) else next(model.parameters()).device


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The tokens that end an output: the model's generation config's and the tokenizer's EOS; a GGUF file in
    llama.cpp: every end-of-generation token its vocabulary marks (llama.cpp's own rule) and the tokenizer's."""
    own = frozenset(model.end_ids) if isinstance(model, LlamaModel) else frozenset()
    return own | eos_token_ids(getattr(model, "generation_config", None), tokenizer)


def check_sources(model: Any, sources: Any) -> None:
    """Refuse, on the llama.cpp engine, sources whose rows ride beside the tree (they need a mask of their own)."""
    if not isinstance(model, LlamaModel):
        return
    riding = [name for name in sources.names if sources.implements(name, "goose_auxiliary_rows")]
    if riding:
        raise ValueError(f"--engine llama.cpp verifies trees only; {', '.join(riding)} adds rows beside the tree "
                         "(an attention mask of their own): leave it out")


__all__ = ["Verifying", "check_sources", "eos_ids", "model_device", "new_verifier"]
