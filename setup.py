"""The one compiled module: the CPU data plane (tierdiag/native/_cplane.c). The project's
metadata is pyproject.toml's; this file only declares the extension, which setuptools'
pyproject table still calls experimental.

`optional=True`: without a C compiler (or Python's headers) the install still succeeds and
the numpy data plane runs instead (tierdiag/native/cplane.py says which one a run used, and
tests/engine/test_cplane.py fails unless the build is there or TIERDIAG_CPLANE=numpy).
`pip install -e .` builds it in place, beside the source."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tierdiag.native._cplane", ["tierdiag/native/_cplane.c"], optional=True)])
