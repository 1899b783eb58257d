"""Where the library keeps what it builds (:func:`cache_dir`: ``hf/``, ``gguf/``, ``flashhead/``, ``tiny/``,
``prompts/``, token counts, the book's npm packages), and file checksums (:func:`sha256_file`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir() -> Path:
    """Root of the cache: ``$THESIS_LIB_CACHE`` or ``~/.cache/thesis-companion``."""
    root = os.environ.get("THESIS_LIB_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "thesis-companion"


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    """sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
