"""Where a run's storage tier kept its pages: the folder its stored config names.

Torch-free: `runs --delete` reads it. (A minimal version; the storage-tier work records the
resolved folder in every run's config under `storage_dir`.)
"""

from __future__ import annotations

from pathlib import Path

STORAGE_DIR_KEY = "storage_dir"


def run_storage_dir(run_info) -> Path | None:
    """The run's storage folder as recorded in its config, or None when it recorded none."""
    value = (getattr(run_info, "config", None) or {}).get(STORAGE_DIR_KEY)
    if not isinstance(value, str) or not value.strip():
        return None
    return Path(value)
