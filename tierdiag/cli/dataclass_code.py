"""`python -m tierdiag.cli.dataclass_code`: write every table of dataclass methods (the read
commands', the replay's, the writer process's) as `make setup` and the benchmarks do. The module
itself is tierdiag/dataclass_code.py (below every layer, so that the writer process's entry in
app/ installs it too); importing this name gives that very module."""

import sys

from tierdiag import dataclass_code as _impl

if __name__ == "__main__":
    print("\n".join(_impl.build_all()))
else:
    sys.modules[__name__] = _impl
