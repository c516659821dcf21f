"""Goose: anisotropic speculation trees for lossless, training-free speculative decoding."""

from goose.candidates import CandidatePool, DecodeContext, Draft, SourceCandidates
from goose.config import GooseConfig
from goose.hookspecs import hookimpl
from goose.outcome import AuxiliaryRows, Harvest, PathKind, VerifyOutcome
from goose.tree import DraftTree, TreeBuilder

__all__ = [
    "AuxiliaryRows",
    "CandidatePool",
    "DecodeContext",
    "Draft",
    "DraftTree",
    "GooseConfig",
    "Harvest",
    "PathKind",
    "SourceCandidates",
    "TreeBuilder",
    "VerifyOutcome",
    "hookimpl",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``goose.hf`` after a plain ``import goose``: ``model.generate(custom_generate=goose.hf.generate)``."""
    if name == "hf":
        import goose.hf

        return goose.hf
    raise AttributeError(f"module 'goose' has no attribute {name!r}")
