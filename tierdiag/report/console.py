"""The console every text view and stderr line draws on (`SafeConsole`, `new_console`), in a
module of its own: `cli/common.py`'s `out` and `err` make theirs from here, so a command that only
asks whether stderr is a terminal (a replay's progress line) or prints a warning loads Rich's
console alone, not every view `report.terminal` holds (its size curves' view imports DuckDB:
~0.05 s of a replay's start-up, issue 41). `report.terminal` re-exports both.
"""

from __future__ import annotations

from rich.console import Console

from tierdiag.report.text import visible


class SafeConsole(Console):
    """A Console for data: it never parses markup nor emoji codes (a `[/]`, `[bold]` or `:smile:` in
    a name, a path or a backend is text; styling goes in as `Text` and `style=`), and every text segment is shown
    with its control characters escaped (`\x1b`) while Rich's own styling still works. Views
    also pass data through `plain`/`visible`, escaped before layout so columns line up; this is
    the net under every view, including ones added later."""

    def __init__(self, **options):
        # Nor emoji codes: a run named `:smile:` is that text, not a face.
        super().__init__(**{"markup": False, "emoji": False, **options})
        # Piped output is complete (docs/contract.md): a COLUMNS below the 80 the views are laid
        # out for would squeeze whole columns away; a wider one is taken as it is.
        if not self.is_terminal and self.width < PIPED_MIN_WIDTH and "width" not in options:
            self.width = PIPED_MIN_WIDTH

    def _render_buffer(self, buffer):
        if self._color_system is None:
            return self._plain_buffer(buffer)
        from rich.segment import Segment

        return super()._render_buffer(
            seg if seg.control else Segment(visible(seg.text), seg.style, seg.control) for seg in buffer)

    def _plain_buffer(self, buffer) -> str:
        """Rich's `_render_buffer` where no style is drawn (piped output, NO_COLOR): its output is
        the segments' texts (a control segment's only where styled or on a terminal, as Rich
        has it), each text escaped; a run of text segments is escaped in one pass over its
        join, the same characters (`visible` maps each control character on its own) without
        a Segment and a regex call per segment (a summary draws thousands, issue 41)."""
        out: list[str] = []
        run: list[str] = []
        terminal = self.is_terminal
        for text, style, control in buffer:
            if not control:
                run.append(text)
                continue
            if run:
                out.append(visible("".join(run)))
                run = []
            if style or terminal:
                out.append(text)
        if run:
            out.append(visible("".join(run)))
        return "".join(out)


PIPED_MIN_WIDTH = 80


def new_console(*, stderr: bool = False) -> SafeConsole:
    """stdout's (or stderr's) console. NO_COLOR (https://no-color.org, any non-empty value)
    turns off all styling, bold and dim included: Rich's own NO_COLOR drops only the colours."""
    import os

    styling = {"color_system": None} if os.environ.get("NO_COLOR") else {}
    return SafeConsole(stderr=stderr, soft_wrap=True, **styling)
