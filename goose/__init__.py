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
