"""Error lines quote what the user gave; a hostile value (a 3,000-character name, a file pasted
into an option) is shown by its ends (report/text.py `abbreviated`), so the line stays one
readable line naming the option and the reason. Property tests over any text, and the CLI end to
end with a long request id and a long option value."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.report.text import LINE_MAX, WORD_MAX, abbreviated

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SMALL, good_lines, tierdiag_in_process, write_trace  # noqa: E402

BOUND = 400 + 160 + len("...[999,999,999,999 characters]...")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=4000) | st.builds(lambda a, n, b: a + "x" * n + b, st.text(max_size=50),
                                          st.integers(0, 20_000), st.text(max_size=50)))
def test_abbreviated_is_bounded_keeps_the_ends_and_leaves_short_lines_alone(line):
    out = abbreviated(line)
    assert len(out) <= max(BOUND, LINE_MAX)
    words = line.split()
    if len(line) <= LINE_MAX and all(len(w) <= WORD_MAX for w in words):
        assert out == line  # nothing to shorten: unchanged, character for character
    else:
        assert "characters]..." in out
        assert out[:20] == line[:20] or len(line.split(None, 1)[0]) > WORD_MAX  # the start stays
        assert out.endswith(line[-20:]) or out.endswith(line.rstrip()[-20:]) or len(out) < len(line)


def test_cli_error_quoting_a_long_value_is_one_short_line(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", good_lines(4))
    db = tmp_path / "s.duckdb"
    assert tierdiag_in_process("replay", trace, "--db", db, *SMALL).code == 0
    code, _, err = tierdiag_in_process("explain", "r" * 5000, "--db", db)
    assert code == 5 and err.count("\n") == 1 and len(err) < 700, err
    assert "no request 'rrrr" in err and "[4,862 characters]" in err and "tierdiag slow" in err
    code, _, err = tierdiag_in_process("replay", trace, "--db", tmp_path / "t2.duckdb", "--time-scale", "9" * 5000 + "x")
    assert code == 2 and err.count("\n") == 1 and len(err) < 700, err
    assert "--time-scale" in err and "is not a number" in err
