"""The reference engine. Its hot modules may be compiled (mypyc, setup.py); compiled.py decides,
once (at the first import of one of them), whether this process runs them or their Python source (TIERDIAG_PURE_ENGINE=1 asks for the
source)."""

from tierdiag.engine import compiled as _compiled

_compiled.install()
