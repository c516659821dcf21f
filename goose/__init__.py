"""Goose: anisotropic speculation trees for lossless, training-free speculative decoding.

What a plugin author needs is importable from here (``hookimpl``, ``Draft``, ``DecodeContext``,
``register``, ...); the decoder (``GooseDecoder``, ``generate``, ``autoregressive``) and
``goose.hf`` are loaded on first use.
"""

from goose.config import GooseConfig
from goose.contract.candidates import CandidatePool, DecodeContext, Draft, SourceCandidates
from goose.contract.outcome import AuxiliaryRows, Harvest, PathKind, VerifyOutcome
from goose.contract.tree import DraftTree, TreeBuilder
from goose.hookspecs import hookimpl
from goose.plugins import PluginError, register, unregister

__all__ = [
    "AuxiliaryRows",
    "CandidatePool",
    "DecodeContext",
    "Draft",
    "DraftTree",
    "GooseConfig",
    "GooseDecoder",
    "Harvest",
    "PathKind",
    "PluginError",
    "SourceCandidates",
    "TreeBuilder",
    "VerifyOutcome",
    "autoregressive",
    "generate",
    "hookimpl",
    "register",
    "unregister",
]
__version__ = "0.1.0"

_DECODER_NAMES = ("GooseDecoder", "AutoregressiveDecoder", "GenerationResult", "generate", "autoregressive")


def __getattr__(name: str) -> object:
    """The decoder's names and ``goose.hf``, loaded on first use (they pull in the model-facing modules)."""
    if name in _DECODER_NAMES:
        from goose.cycle import decoder

        return getattr(decoder, name)
    if name == "hf":
        import goose.hf

        return goose.hf
    raise AttributeError(f"module 'goose' has no attribute {name!r}")
