"""Tables that fit: a table where it fits the console's width, else stacked one block a row, so every
table is complete and readable at 80 columns and no cell is cut with "…" (issue 42). Rich only:
every view module may import it (report.terminal re-exports it)."""

from __future__ import annotations

from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from tierdiag.report.text import visible


def plain(text: object, style: str = "") -> Text:
    """Data as Text, never markup, controls escaped (report.terminal.plain's twin)."""
    return Text(visible(text, lines=False), style=style)


def fits(console: Console, renderable, width: int | None = None) -> bool:
    """Whether `renderable` fits `width` (default: the console's) unwrapped, so no cell is cut."""
    # Measured against an unbounded width: Measurement.get clamps to the options' max_width.
    unbounded = console.options.update_width(1 << 20)
    return Measurement.get(console, unbounded, renderable).maximum <= (width or console.width)


def stacked(table: Table) -> Group:
    """`table` one block a row, for a width it does not fit: the row's first cell as a heading, then
    each other column as `header  value` on a line of its own (a value wraps at its spaces, a run id
    or `host_tokens=1048576` stays whole). Nothing is cut; the title and caption stay."""
    headers = [Text(c.header) if isinstance(c.header, str) else c.header for c in table.columns]
    cells = [list(c._cells) for c in table.columns]
    parts: list = []
    if table.title is not None:
        parts.append(table.title if isinstance(table.title, Text) else plain(table.title, "bold"))
    for i in range(table.row_count):
        head = cells[0][i] if cells else ""
        label = headers[0].plain.strip() if headers else ""
        heading = Text.assemble((f"{label} " if label else "", "dim"), head if isinstance(head, Text) else plain(head))
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim", max_width=24, overflow="fold")
        grid.add_column(overflow="fold")
        for h, column in zip(headers[1:], cells[1:]):
            value = column[i]
            grid.add_row("  " + h.plain.strip(), value if not isinstance(value, str) else plain(value))
        parts += [heading.copy() if isinstance(heading, Text) else heading, grid]
    if table.caption is not None:
        parts.append(table.caption if isinstance(table.caption, Text) else plain(table.caption, "dim"))
    return Group(*parts)


def print_table(console: Console, table: Table) -> None:
    """A table where it fits the console's width (a terminal's, or 80 columns piped), else stacked:
    every table complete and readable at 80 columns, none cut with "…"."""
    console.print(table if fits(console, table) else stacked(table))


