"""The compiled modules: the CPU data plane (tierdiag/native/csrc/, a source file an owner:
csrc/cplane.h says which), diagnose's stack depths, and the engine core (issue 41): the engine's
hot modules compiled by mypyc from their own source, which stays the Python twin. The project's
metadata is pyproject.toml's; this file only declares the extensions, which setuptools'
pyproject table still calls experimental.

Every extension is optional: without a C compiler (or Python's headers) the install still
succeeds and the Python paths run (tierdiag/native/cplane.py says which data plane a run used;
tierdiag/engine/compiled.py which engine core). The engine core is compiled only where mypyc
imports (pyproject's build-system requires it; a `python setup.py build_ext` without mypy
installed skips it) and mypyc accepts the source; tierdiag/engine/_compiled.json records what
the build did and why, and `tierdiag doctor` says it. TIERDIAG_PURE_ENGINE=1 at build time skips
it. `pip install -e .` builds everything in place, beside the sources."""

import importlib.util
import json
import os
import shutil
from glob import glob
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCES = sorted(glob("tierdiag/native/csrc/*.c"))
HERE = Path(__file__).resolve().parent

# The mypy options the engine core is checked and compiled with. Imports outside the compiled
# modules are not followed (they are Any to mypyc: the config, the probes, numpy). Disabled codes:
# the narrowing of Optionals the code proves by its own logic (union-attr, arg-type, index,
# operator, type-var, return-value on `X | None`) and calls across the Scheduler's mixins
# (attr-defined): mypyc then emits a checked generic operation there, which raises where Python
# would, instead of a native one.
MYPY_OPTIONS = ["--follow-imports=skip", "--ignore-missing-imports", "--python-version", "3.10",
                *[a for code in ("attr-defined", "union-attr", "arg-type", "index", "operator", "type-var",
                                 "return-value", "misc")
                  for a in ("--disable-error-code", code)]]


def _compiled_module():
    """tierdiag/engine/compiled.py, loaded by path (the package itself is not imported here)."""
    spec = importlib.util.spec_from_file_location("_tierdiag_engine_compiled", HERE / "tierdiag/engine/compiled.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def engine_extensions() -> list:
    """mypyc's extensions for the engine core, or none (and why, in _compiled.json)."""
    comp = _compiled_module()
    manifest = {"compiled": False}
    exts = []
    if os.environ.get(comp.ENV, "") not in ("", "0"):
        manifest["why"] = f"not compiled: {comp.ENV} was set at build time"
    else:
        try:
            import mypy.version
            from mypyc.build import mypycify
        except ImportError as exc:
            manifest["why"] = f"not compiled: mypyc was not installed at build time ({exc})"
        else:
            paths = [str(comp.source_path(m).relative_to(HERE)) for m in comp.MODULES]
            try:
                exts = mypycify(MYPY_OPTIONS + paths, opt_level="3", group_name="tierdiag.engine._compiled")
            except (Exception, SystemExit) as exc:  # mypyc rejects the source: the twin runs, and says so
                print(f"warning: the engine core is not compiled: mypyc refused it ({exc!r}); the Python engine runs")
                manifest["why"] = f"not compiled: mypyc refused the source ({exc!r}); see the build's output"
                exts = []
            else:
                manifest = {"compiled": True, "mypy": mypy.version.__version__,
                            "sources": {m: comp.source_digest(comp.source_path(m)) for m in comp.MODULES},
                            "stats": {m: comp.source_stat(comp.source_path(m)) for m in comp.MODULES}}
    for ext in exts:
        ext.optional = True  # no C compiler: the extensions are missing and compiled.py runs the twin
    comp.MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    return exts


class BuildExt(build_ext):
    """build_ext that adds the engine core's extensions when it runs (not when setup.py is only
    asked for metadata: mypyc type-checks and generates C, which takes a minute)."""

    def finalize_options(self):
        if not any(getattr(e, "_tierdiag_engine", False) for e in self.distribution.ext_modules or []):
            exts = engine_extensions()
            for ext in exts:
                ext._tierdiag_engine = True
            self.distribution.ext_modules = list(self.distribution.ext_modules or []) + exts
        super().finalize_options()

    def run(self):
        super().run()
        if not self.inplace:  # a wheel: the manifest goes with the extensions (in place, it is there already)
            manifest = _compiled_module().MANIFEST
            target = Path(self.build_lib) / "tierdiag" / "engine" / manifest.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(manifest, target)


setup(ext_modules=[Extension("tierdiag.native._cplane", SOURCES, depends=glob("tierdiag/native/csrc/*.h"),
                             optional=True),
                   # diagnose's LRU stack depths (diagnose/run/size_curves.py; its Python reference runs without it)
                   Extension("tierdiag.native._stackdist", ["tierdiag/native/stackdist/stackdist.c"], optional=True),
                   # diagnose's session pauses in one sweep (diagnose/session/session_pool.py; its numpy reference runs without it)
                   Extension("tierdiag.native._sessions", ["tierdiag/native/sessions/sessions.c"], optional=True)],
      cmdclass={"build_ext": BuildExt})
