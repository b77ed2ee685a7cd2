"""A signal that lands while a module is imported waits for the import to finish.

Raised inside a native extension's initialisation (DuckDB's nanobind enum creation, where a
SIGTERM to the process group landed in CI), `Interrupted` aborted the interpreter ("Critical
nanobind error", exit -6) with a traceback instead of exit 143 and one line. The handler now
holds such a signal and hands it back to the process a moment later; these tests import a
module that signals itself half-way and check the import ran to its end before the interrupt.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import os, signal, sys, time
    sys.path.insert(0, sys.argv[1])
    from tierdiag import signals
    signals.install()
    try:
        import selfsignal
        # the import ran to its end; the held signal arrives after it
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.001)
        print("never interrupted")
    except signals.Interrupted as exc:
        mod = sys.modules.get("selfsignal")
        print("interrupted", exc.signum, "finished" if getattr(mod, "FINISHED", False) else "cut")
''')

MODULE = textwrap.dedent('''
    import os, signal, time
    os.kill(os.getpid(), signal.{sig})
    t = time.monotonic()
    while time.monotonic() - t < 0.2:  # long enough for the re-delivery to come while importing
        pass
    FINISHED = True
''')


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_an_import_is_raised_after_it(tmp_path, sig):
    (tmp_path / "selfsignal.py").write_text(MODULE.format(sig=sig.name))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["interrupted", str(int(sig)), "finished"], (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr


def test_a_signal_inside_a_deferred_block_during_an_import_still_waits_for_the_block(tmp_path):
    """Inside a store write the deferred block's rule holds (recorded, raised at its end), import or not."""
    (tmp_path / "selfsignal.py").write_text(MODULE.format(sig="SIGTERM"))
    script = textwrap.dedent('''
        import sys
        sys.path.insert(0, sys.argv[1])
        from tierdiag import signals
        signals.install()
        try:
            with signals.deferred():
                import selfsignal
                print("block done", signals.pending())
        except signals.Interrupted as exc:
            print("interrupted", exc.signum)
    ''')
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["block", "done", "15", "interrupted", "15"], (r.stdout, r.stderr)
