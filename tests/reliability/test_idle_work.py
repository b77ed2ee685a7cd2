"""threads.idle_work: work a thread leaves for its first wait on another thread (a read command's
text view imported while the store opens or explain's reads run). It runs on that thread, once,
only where it would block; never where nothing is waited for, and never after its block."""

from __future__ import annotations

import threading

from tierdiag.threads import OnThread, idle, idle_work


def _slow(gate: threading.Event) -> str:
    gate.wait(10)
    return "done"


def test_the_first_blocking_wait_runs_it_on_the_callers_thread_once():
    ran: list[int] = []
    gate = threading.Event()
    job = OnThread(_slow, gate, name="test-idle")
    with idle_work(lambda: (ran.append(threading.get_ident()), gate.set())):
        assert job.result() == "done"  # blocked: the work ran first (it opens the gate itself)
        idle()  # a second wait: nothing left
    assert ran == [threading.get_ident()]


def test_a_wait_that_would_not_block_leaves_it_and_the_block_forgets_it():
    ran: list[str] = []
    gate = threading.Event()
    gate.set()
    job = OnThread(_slow, gate, name="test-idle")
    job.join()
    with idle_work(lambda: ran.append("x")):
        assert job.result() == "done"  # the thread had ended: no wait, no work
    idle()  # after the block: forgotten
    assert ran == []


def test_another_threads_wait_never_runs_it():
    ran: list[str] = []
    seen: list[str] = []
    with idle_work(lambda: ran.append("x")):
        other = threading.Thread(target=lambda: (idle(), seen.append("waited")))
        other.start()
        other.join()
    assert seen == ["waited"] and ran == []


def test_what_it_raises_is_raised_at_the_wait():
    gate = threading.Event()
    job = OnThread(_slow, gate, name="test-idle")

    def fails() -> None:
        gate.set()
        raise ImportError("no such view")

    with idle_work(fails):
        try:
            job.result()
        except ImportError as exc:
            assert "no such view" in str(exc)
        else:
            raise AssertionError("the work's error was not raised")
    assert job.result() == "done"
