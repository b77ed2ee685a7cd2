"""The one compiled module: the CPU data plane (tierdiag/native/csrc/, a source file an owner:
csrc/cplane.h says which). The project's metadata is pyproject.toml's; this file only declares
the extension, which setuptools' pyproject table still calls experimental.

`optional=True`: without a C compiler (or Python's headers) the install still succeeds and
the numpy data plane runs instead (tierdiag/native/cplane.py says which one a run used, and
tests/engine/test_cplane.py fails unless the build is there or TIERDIAG_CPLANE=numpy).
`pip install -e .` builds it in place, beside the facade."""

from glob import glob

from setuptools import Extension, setup

SOURCES = sorted(glob("tierdiag/native/csrc/*.c"))

setup(ext_modules=[Extension("tierdiag.native._cplane", SOURCES, depends=glob("tierdiag/native/csrc/*.h"),
                             optional=True),
                   # diagnose's LRU stack depths (diagnose/run/size_curves.py; its Python reference runs without it)
                   Extension("tierdiag.native._stackdist", ["tierdiag/native/stackdist/stackdist.c"], optional=True)])
