"""The replay's writer process: the store's writer loop (store/writer_process.py) with the
replay's close hook (diagnose/run/close.py: the run evidence and the closing numbers)."""

from __future__ import annotations

# The child's `python -c` code; also how a test tells the writer apart from other processes.
ENTRY = "from tierdiag.app.writer_child import main; main()"


def main() -> None:
    from tierdiag.diagnose.run import close
    from tierdiag.store import writer_serve

    writer_serve.main(after_commit=close.after_commit, preload=close.PRELOAD)
