"""The one place that chooses which CPU data plane this process runs: the compiled one
(`_cplane`, built from csrc/ by `pip install -e .`) or the numpy/Python reference beside each
owner. Chosen once, at import:

    TIERDIAG_CPLANE   unset or "auto": the compiled data plane when it is built, else numpy
                      "numpy": numpy, even where the compiled one is built
                      "c": the compiled one; a ConfigError (exit 2) if it is not built or
                      is stale, as for any other value

Each numpy<->C pair is declared where its owner lives, by one call here:

    copy_rows = cplane.choose("rows.copy_rows", copy_rows_c, copy_rows_numpy)

which returns the backend this process uses and registers the pair (`pairs()`: what the tests
run both sides of, and check that the choice was the same for all). The compiled side is
usually a thin wrapper around a `_cplane` function, taken with `compiled(name)` (None on the
numpy data plane, so the wrapper is never chosen then). `DataPlane.to_json()` records the
choice (`cpu_kernel`) with every run. Both backends move the same bytes into the same slots,
hand out the same slots in the same order and raise the same errors: the compiled one does
what it can prove safe, and for anything else (a bad slot, an odd list type) changes nothing
and lets the reference move the bytes or raise its message.

No torch here: a CPU replay imports neither.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, TypeVar

from tierdiag.errors import ConfigError

ENV = "TIERDIAG_CPLANE"
CHOICES = ("auto", "c", "numpy")
# What the compiled module must say it implements (csrc/cplane.h's CPLANE_API): a build from an
# older source, left in place by an earlier editable install, is not used.
API = 33

T = TypeVar("T")


def _load(choice: str) -> tuple[ModuleType | None, str]:
    """(the compiled module or None, why not when None)."""
    if choice == "numpy":
        return None, f"{ENV}=numpy"
    try:
        from tierdiag.native import _cplane
    except ImportError as exc:
        return None, f"not built ({exc}); `pip install -e .` compiles tierdiag/native/csrc/"
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

_PAIRS: dict[str, tuple[Any, Any]] = {}


def compiled(name: str) -> Any:
    """The compiled data plane's `name` (a function or type of `_cplane`), None on the numpy
    data plane: what a pair's compiled wrapper calls."""
    return None if C is None else getattr(C, name)


def choose(name: str, compiled_impl: T, reference: T) -> T:
    """The side of the pair `name` ("owner.function") this process uses: `compiled_impl` on the
    compiled data plane, else `reference`. Registers the pair for `pairs()`."""
    _PAIRS[name] = (compiled_impl, reference)
    return reference if C is None else compiled_impl


def pairs() -> dict[str, tuple[Any, Any]]:
    """Every pair declared so far (by the modules imported): name -> (compiled, reference)."""
    return dict(_PAIRS)
