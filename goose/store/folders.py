"""Folders that appear complete or not at all: built aside, then renamed into place.

A model cache or a datastore is a folder of several files; a process killed halfway must not leave
one that a later run trusts. Build it in a sibling temporary folder, write the marker file last,
then :func:`publish` it with one rename.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def publish(built: Path, final: Path, marker: str, *, replace: bool = False) -> None:
    """Rename the finished folder ``built`` to ``final``.

    ``marker`` is the file written last into a complete folder. A complete folder already at
    ``final`` (another process built the same thing meanwhile) is kept unless ``replace``; an
    incomplete leftover is removed.
    """
    if final.exists():
        if (final / marker).is_file() and not replace:
            return
        shutil.rmtree(final)
    try:
        os.rename(built, final)
    except OSError:
        if not (final / marker).is_file():  # lost a race to a process that published first
            raise
