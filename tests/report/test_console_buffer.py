"""SafeConsole's output where no style is drawn (piped, NO_COLOR): the buffer's texts escaped a run
at a time (report/console.py `_plain_buffer`) are exactly what escaping each text segment on its
own and handing the segments to Rich's `_render_buffer` gives, for hostile text (controls, escapes,
lone surrogates, bidi overrides), styled or not, with control segments between, on a terminal
or not."""

from __future__ import annotations

import io

from hypothesis import given, settings, strategies as st
from rich.console import Console
from rich.segment import Segment
from rich.style import Style

from tierdiag.report.console import SafeConsole
from tierdiag.report.text import visible

_HOSTILE = st.text(alphabet=st.sampled_from(["a", " ", "\n", "\t", "\x1b", "\x07", "\x00", "\x7f", "\x9b", "\u202e",
                                             "\u200b", "\ufeff", "\udcff", "\ud800", "é", "·", "─", "[", "]", ":"]),
                   max_size=12)
_SEGMENT = st.builds(lambda text, styled, control: Segment(text, Style(bold=True) if styled else None,
                                                           [(1, )] if control else None),
                     _HOSTILE, st.booleans(), st.booleans())


def _reference(console: SafeConsole, segments: list[Segment]) -> str:
    """What the view printed before: each text segment escaped on its own, then Rich's own join."""
    return Console._render_buffer(console, [s if s.control else Segment(visible(s.text), s.style, s.control)
                                            for s in segments])


@settings(max_examples=300, deadline=None)
@given(segments=st.lists(_SEGMENT, max_size=12), terminal=st.booleans())
def test_the_plain_buffer_is_the_segments_escaped_one_by_one(segments, terminal):
    console = SafeConsole(file=io.StringIO(), force_terminal=terminal, color_system=None)
    assert console._color_system is None
    assert console._render_buffer(iter(segments)) == _reference(console, segments)


def test_a_styled_console_still_escapes_each_text_segment():
    console = SafeConsole(file=io.StringIO(), force_terminal=True, color_system="standard")
    out = console._render_buffer([Segment("a\x1b[2Jb", Style(bold=True)), Segment("\x07")])
    assert "\x1b[2J" not in out and "\\x1b[2J" in out and "\\x07" in out


def test_a_printed_table_is_the_same_both_ways():
    """A whole view's worth of segments (a titled table with hostile cells) through print()."""
    from tierdiag.report.terminal import new_table, plain

    def printed(render_buffer) -> str:
        buf = io.StringIO()
        console = SafeConsole(file=buf, width=80, soft_wrap=True)
        console._render_buffer = render_buffer.__get__(console)
        table = new_table("run \x1b]0;title\x07 · évictions")
        table.add_column("who")
        table.add_column("tokens", justify="right")
        for i in range(5):
            table.add_row(plain(f"req-\u202e{i}\x1b[31m"), f"{i * 1000:,}")
        console.print(table)
        return buf.getvalue()

    assert printed(SafeConsole._render_buffer) == printed(lambda self, b: _reference(self, list(b)))
