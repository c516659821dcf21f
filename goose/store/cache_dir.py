"""Where Goose keeps what it builds once per machine: dequantized models, cost curves, datastores."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$GOOSE_CACHE``, else ``~/.cache/goose``."""
    env = os.environ.get("GOOSE_CACHE", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "goose"


__all__ = ["default_cache_dir"]
