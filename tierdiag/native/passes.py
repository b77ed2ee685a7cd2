"""Diagnose's two optional C passes, built by setup.py beside the data plane (`optional=True`: a
machine without a C compiler installs without them): `_stackdist`, the size curves' LRU stack
depths (diagnose/run/size_curves.py), and `_sessions`, the session pauses' sweep
(diagnose/session/session_pool.py). Where one is not built, its numpy/Python reference runs:
the same evidence, slower on large runs. `describe()` says which runs here (`tierdiag doctor`).
"""

from __future__ import annotations

import importlib
import os

from tierdiag.native.cplane import ENV

# (module, what it computes, whether TIERDIAG_CPLANE=numpy sends it to its reference too)
PASSES = (("_stackdist", "the size curves' stack depths", True),
          ("_sessions", "the session pauses' sweep", False))


def describe() -> dict[str, dict[str, str | None]]:
    """{module: {"mode": "compiled" | "python", "why": None | why the reference runs}}."""
    forced = os.environ.get(ENV, "").strip().lower() == "numpy"
    out: dict[str, dict[str, str | None]] = {}
    for name, _what, follows_env in PASSES:
        try:
            importlib.import_module(f"tierdiag.native.{name}")
        except ImportError as exc:
            out[name] = {"mode": "python", "why": f"not built ({exc})"}
            continue
        if forced and follows_env:
            out[name] = {"mode": "python", "why": f"{ENV}=numpy"}
        else:
            out[name] = {"mode": "compiled", "why": None}
    return out
