"""Import SGLang's own cache modules on a CPU, in a process of their own (the worker).

Runs only inside a worker process (tests/sglang/worker.py), never in pytest's: the stubs it
installs (triton, sgl_kernel, ...) would shadow the real triton that tierdiag's own kernel tests
use. What it does, as /work/shared/SGLANG_ON_CPU.md describes:

- a bare `sglang` package (sglang/__init__.py is the frontend: never run);
- permissive stub modules for GPU packages that `sglang.*` imports at module level but never
  calls on the cache paths (only when the import comes from an `sglang.*` module);
- `torch.compile` and Dynamo's `disable` as no-op decorators (torch._dynamo is not imported for
  them); CUDA streams/events that complete synchronously;
- a single-rank gloo process group;
- a logical clock in place of `time.monotonic` (see `Clock`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

# GPU packages imported at module level by sglang.srt.*: always stubbed (the real triton, where
# installed, would try to find a GPU driver when a kernel is launched). Anything else that an
# sglang.* module imports and is not installed (frontend and model packages: transformers, PIL,
# torchvision, ...) gets a stub too, from the finder placed last on sys.meta_path.
GPU_ROOTS = ("triton", "sgl_kernel", "flashinfer", "deep_gemm", "flash_attn", "cuda", "nvtx",
             "torch_memory_saver", "quack", "cutlass", "tvm_ffi")


class _StubBase:
    """What a class deriving from a stub derives from instead (accepts any class keywords)."""

    def __init_subclass__(cls, **kwargs):
        pass

    def __init__(self, *args, **kwargs):
        pass

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        from pydantic_core import core_schema  # a class deriving from a stub used as a field type

        return core_schema.any_schema()


class Permissive(types.ModuleType):
    """A module (and value) that has every attribute: calling it returns a fresh stub, except
    that a single function or class argument is handed back (decorators such as triton.jit) and
    that a GPU package's call without arguments (a device query) raises, as it would without a
    GPU."""

    __path__: list = []  # a package: submodules import too

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = Permissive(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value

    def __call__(self, *args, **kwargs):
        if not args and not kwargs and self.__name__.split(".", 1)[0] in GPU_ROOTS:
            # a query of the device (triton.runtime.driver...): there is none
            raise RuntimeError(f"{self.__name__}: a stub (no GPU in this process)")
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], Permissive):
            return args[0]
        return Permissive(f"{self.__name__}()")

    def __getitem__(self, item):
        return self

    def __setitem__(self, item, value):
        pass

    def __contains__(self, item):
        return False

    def __get_pydantic_core_schema__(self, source, handler):
        from pydantic_core import core_schema  # a stub used as a field type (openai protocol models)

        return core_schema.any_schema()

    def __mro_entries__(self, bases):
        return (_StubBase,)

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __or__(self, other):
        return self

    __ror__ = __or__


def _importer() -> str:
    """The module whose import statement is running (the first frame outside importlib)."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_globals.get("__name__", "").startswith("importlib")
                                 or frame.f_code.co_filename.startswith("<frozen")):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a Permissive module: `gpu` (first on sys.meta_path) for GPU_ROOTS, otherwise
    (last) for any module imported from sglang.* that no other finder could find."""

    def __init__(self, gpu: bool):
        self.gpu = gpu

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.split(".", 1)[0]
        if isinstance(sys.modules.get(root), Permissive):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if self.gpu and root not in GPU_ROOTS:
            return None
        if root == "sglang" or not _importer().startswith("sglang."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = Permissive(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


class Clock:
    """The logical clock both sides share: `step` is the request's ordinal (the engine's now_ns);
    every reading SGLang takes inside a step is strictly later than the one before it (as real
    time.monotonic readings are), so its eviction heaps never meet a tie whose order would depend
    on set iteration (TreeNode hashes by id)."""

    def __init__(self):
        self.step = 0
        self.ticks = 0
        self.fine = True  # False: every reading in a step is the step (ties, as the engine has them)

    def set_step(self, step: int) -> None:
        self.step = step
        self.ticks = 0

    def monotonic(self) -> float:
        if not self.fine:
            return float(self.step)
        self.ticks += 1
        return self.step + self.ticks * 1e-6


class _SyncEvent:
    """A CUDA event whose work is always done: a copy is acknowledged at the next check."""

    def __init__(self, *a, **k):
        pass

    def record(self, *a, **k):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass

    def wait(self, *a, **k):
        pass


class _SyncStream:
    def __init__(self, *a, **k):
        pass

    def wait_event(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def sync_device_module() -> types.SimpleNamespace:
    return types.SimpleNamespace(Stream=_SyncStream, Event=_SyncEvent, current_stream=lambda *a: _SyncStream(),
                                 stream=lambda *a, **k: _SyncStream(), synchronize=lambda *a: None)


class _LazyDynamo(types.ModuleType):
    """`torch._dynamo` as an attribute of torch until something reads more of it than `disable`
    (then the real package is imported, which puts itself in this one's place on torch). An
    `import torch._dynamo` statement never sees this object: it is not in sys.modules."""

    @staticmethod
    def disable(fn=None, *args, **kwargs):
        return fn if callable(fn) else (lambda f: f)

    def __getattr__(self, name: str):
        import importlib

        return getattr(importlib.import_module("torch._dynamo"), name)


def install(root: str) -> None:
    """Make `import sglang.srt...` load from `root` (an unzipped wheel) without sglang/__init__.py."""
    os.environ.setdefault("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")
    sys.meta_path.insert(0, _StubFinder(gpu=True))
    sys.meta_path.append(_StubFinder(gpu=False))
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [os.path.join(root, "sglang")]
    pkg.__file__ = os.path.join(root, "sglang", "__init__.py")
    sys.modules["sglang"] = pkg
    import importlib.util

    if importlib.util.find_spec("regex") is None:
        # 0.5.23's parsers build patterns from `regex` at import time (never matched on the cache
        # paths); the stdlib's `re` accepts them.
        import re

        sys.modules["regex"] = re
    import torch

    torch.compile = lambda fn=None, *a, **k: fn if callable(fn) else (lambda f: f)
    # Dynamo's `disable` decorators likewise (nothing here is compiled): `torch.compiler.disable`
    # and `torch._dynamo.disable` at the import of SGLang's kernel loaders and layers imported
    # torch._dynamo (~2.4 s of a worker's ~5 s start-up CPU) only to mark functions that no
    # compiler ever sees. Any other use of torch._dynamo still imports the real one (_LazyDynamo).
    torch.compiler.disable = torch.compile
    if "torch._dynamo" not in sys.modules:
        torch._dynamo = _LazyDynamo("torch._dynamo")
    import torch.distributed as dist

    if not dist.is_initialized():
        # One rank: SGLang asks the tp group its world size (1, so it never all-reduces).
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
