"""The writer process's inbox (store/writer_serve.py `Inbox`): the frames read from the engine's
pipe wait there for the writer's main thread, bounded in bytes (issue 41: a writer behind the
engine held every frame handed to it: a loaded 1M run peaked ~500 MB over a quiet one). A full
inbox holds the reader thread, so the pipe fills and the engine's hand-over waits."""

from __future__ import annotations

import os
import queue
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from tierdiag.store import writer_process, writer_serve
from tierdiag.store.frames import EOF, send_frame


def test_the_inbox_bound_is_a_positive_size_under_the_writers_memory():
    assert isinstance(writer_process.INBOX_BYTES, int) and 1 << 20 <= writer_process.INBOX_BYTES <= 1 << 30


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 5_000), max_size=40), limit=st.integers(0, 12_000),
       take_every=st.integers(1, 5))
def test_frames_come_out_in_order_and_the_inbox_never_holds_more_than_its_bound(sizes, limit, take_every):
    """Whatever the frames' sizes (empty, larger than the bound) and the bound (zero too), a
    producer thread putting them and a consumer taking them see every frame once, in order; the
    inbox never holds past its bound but for one frame taken into an empty inbox; EOF passes."""
    inbox = writer_serve.Inbox(limit)
    frames = [bytes([i % 251]) * n for i, n in enumerate(sizes)] + [EOF]
    seen_most = []

    def produce():
        for f in frames:
            inbox.put(f)
            seen_most.append(inbox.held())

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    got = []
    while not got or got[-1] is not EOF:
        got.append(inbox.get(timeout=10))
        if len(got) % take_every == 0:
            time.sleep(0)  # let the producer fill it meanwhile
    t.join(timeout=10)
    assert not t.is_alive()
    assert got == frames
    biggest = max(sizes, default=0)
    assert inbox.most <= max(limit, biggest)
    assert all(h <= max(limit, biggest) for h in seen_most)
    assert inbox.empty() and inbox.held() == 0


def test_a_full_inbox_holds_the_reader_until_a_frame_is_taken():
    inbox = writer_serve.Inbox(10)
    inbox.put(b"x" * 8)
    done = threading.Event()

    def put_more():
        inbox.put(b"y" * 5)  # 13 > 10: waits for room
        done.set()

    threading.Thread(target=put_more, daemon=True).start()
    assert not done.wait(0.2)
    assert inbox.get(timeout=1) == b"x" * 8
    assert done.wait(5)
    assert inbox.waits == 1 and inbox.waited_s > 0.1
    assert inbox.get(timeout=1) == b"y" * 5
    inbox.put(EOF)  # weighs nothing: never waits
    assert inbox.get(timeout=1) is EOF


@pytest.mark.parametrize("timeout", [0, 0.0, 0.05])
def test_an_empty_inbox_raises_empty_at_its_timeout(timeout):
    inbox = writer_serve.Inbox(100)
    t0 = time.monotonic()
    with pytest.raises(queue.Empty):
        inbox.get(timeout=timeout)
    assert time.monotonic() - t0 < 5
    assert inbox.empty()


def test_a_writer_behind_the_engine_makes_its_hand_overs_wait_on_the_pipe():
    """The reader thread (`_read_requests`) stops draining the pipe once the inbox is full: what
    the engine writes after that stays in the pipe, and its write waits when the pipe is full."""
    r, w = os.pipe()
    inbox = writer_serve.Inbox(1_000)
    reader = threading.Thread(target=writer_serve._read_requests, args=(r, inbox), daemon=True)
    reader.start()
    os.set_blocking(w, False)
    sent = 0
    with pytest.raises(BlockingIOError):
        for _ in range(10_000):  # frames of ~4 KiB: the inbox takes one, then the pipe fills
            send_frame(w, ("rows", b"z" * 4_000))
            sent += 1
    assert inbox.held() <= 5_000 and sent < 10_000
    os.set_blocking(w, True)
    got = 0
    while got < sent:
        inbox.get(timeout=10)
        got += 1
    os.close(w)
    assert inbox.get(timeout=10) is EOF  # a frame (under PIPE_BUF) is written whole or not at all
    reader.join(timeout=10)
    os.close(r)


@settings(max_examples=40, deadline=None)
@given(script=st.lists(st.one_of(st.just(None), st.binary(min_size=0, max_size=300)), max_size=30))
def test_a_stop_on_the_pipe_calls_stop_and_is_never_queued(script):
    """The engine's STOP (frames.send_stop, a frame of no body) among any frames, empty payloads
    included: the reader thread calls `stop()` once for each, in its place, and hands every other
    frame to the inbox unchanged and in order (issue 41, session 37 h47sig)."""
    from tierdiag.store.frames import loads, send_stop

    r, w = os.pipe()
    inbox = writer_serve.Inbox(1 << 20)
    seen: list = []
    reader = threading.Thread(target=writer_serve._read_requests,
                              args=(r, inbox, lambda: seen.append(("stop", inbox.held()))), daemon=True)
    reader.start()
    expected = []
    for item in script:
        if item is None:
            send_stop(w)
            expected.append("stop")
        else:
            send_frame(w, ("rows", item))
            expected.append(("rows", item))
    os.close(w)
    got = []
    while True:
        body = inbox.get(timeout=10)
        if body is EOF:
            break
        got.append(loads(body))
    reader.join(timeout=10)
    os.close(r)
    assert got == [e for e in expected if e != "stop"]
    assert len(seen) == expected.count("stop")
