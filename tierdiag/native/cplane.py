"""Which CPU kernel moves a CPU pool's bytes: the compiled one (`_cplane`, built from
_cplane.c by `pip install -e .`) or numpy (rows.py, pools.py: the reference and the fallback).

    TIERDIAG_CPLANE   unset or "auto": the compiled kernel when it is built, else numpy
                      "numpy": numpy, even where the kernel is built
                      "c": the compiled kernel; a ConfigError (exit 2) if it is not built or
                      is stale, as for any other value

Chosen once, at import: rows.py binds `copy_rows`, pools.py `write_content`,
`verify_content` and PagePool's `alloc`/`free` to the chosen backend's functions, and
`DataPlane.to_json()` records the choice (`cpu_kernel`) with every run. Both backends move the
same bytes into the same slots, hand out the same slots in the same order and raise the same
errors (tests/engine/test_cplane.py runs every backend on the same cases): the compiled one
does what it can prove safe, and for anything else (a bad slot, an odd list type) changes
nothing and lets the numpy path move the bytes or raise its message.

No torch here: a CPU replay imports neither.
"""

from __future__ import annotations

import os
from types import ModuleType

from tierdiag.errors import ConfigError

ENV = "TIERDIAG_CPLANE"
CHOICES = ("auto", "c", "numpy")
# What _cplane.c must say it implements (its CPLANE_API): a build from an older source, left in
# place by an earlier editable install, is not used.
API = 5


def _load(choice: str) -> tuple[ModuleType | None, str]:
    """(the compiled module or None, why not when None)."""
    if choice == "numpy":
        return None, f"{ENV}=numpy"
    try:
        from tierdiag.native import _cplane
    except ImportError as exc:
        return None, f"not built ({exc}); `pip install -e .` compiles tierdiag/native/_cplane.c"
    if getattr(_cplane, "API", None) != API:
        return None, (f"stale build (API {getattr(_cplane, 'API', None)}, this source wants {API}); "
                      f"`pip install -e .` rebuilds it")
    return _cplane, ""


def _choose() -> tuple[ModuleType | None, str]:
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ConfigError(f"{ENV}={os.environ[ENV]!r} must be auto, c or numpy")
    module, why = _load(choice)
    if module is None and choice == "c":
        raise ConfigError(f"{ENV}=c but the compiled CPU data plane is unusable: {why}")
    return module, why


C, WHY_NOT = _choose()
#: The backend every CPU pool of this process uses: "c" or "numpy".
CPU_KERNEL = "numpy" if C is None else "c"
