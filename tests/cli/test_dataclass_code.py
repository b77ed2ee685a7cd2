"""cli/dataclass_code.py: the methods `dataclasses` writes for each class, compiled once and kept
beside the bytecode. The methods made through the table are the methods made without it (equal
code objects, the same behaviour), cold (compiled, then written back) and warm (read from the
file); a file that is not a table is ignored and replaced; nothing is written where bytecode is
not; the read commands print the same either way."""

from __future__ import annotations

import dataclasses
import marshal
import os
import subprocess
import sys
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierdiag.cli import dataclass_code as dc

METHODS = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__", "__lt__", "__le__",
           "__gt__", "__ge__")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    """No table installed before or after; bytecode written (the suite may run with
    PYTHONDONTWRITEBYTECODE set), unless a test says otherwise."""
    dc.uninstall()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    yield
    dc.uninstall()


def _kinds():
    """Dataclasses of every shape `dataclasses` writes methods for, made fresh on each call."""

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        a: int
        b: str = "x"
        c: tuple = ()
        d: list = dataclasses.field(default_factory=list, compare=False)

    @dataclasses.dataclass(order=True, slots=True)
    class Ordered:
        x: float
        y: int | None = None

    @dataclasses.dataclass(kw_only=True, unsafe_hash=True)
    class KwOnly:
        n: int
        label: str = "\u00b7 \\n'\""
        shared: ClassVar[int] = 3

    @dataclasses.dataclass
    class PostInit:
        raw: dataclasses.InitVar[int]
        doubled: int = dataclasses.field(init=False, default=0)

        def __post_init__(self, raw):
            self.doubled = 2 * raw

    return Frozen, Ordered, KwOnly, PostInit


def _codes(classes) -> list:
    out = []
    for cls in classes:
        for name in METHODS:
            fn = cls.__dict__.get(name)
            out.append((cls.__name__, name, getattr(fn, "__code__", fn)))
    return out


def _behaviour(classes) -> list:
    Frozen, Ordered, KwOnly, PostInit = classes
    f = Frozen(1, c=(2,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.a = 2
    return [repr(f), f == Frozen(1, c=(2,)), hash(f) == hash(Frozen(1, c=(2,))), Ordered(1.0) < Ordered(2.0),
            repr(Ordered(0.5, 3)), repr(KwOnly(n=4)), hash(KwOnly(n=4)) == hash(KwOnly(n=4)),
            PostInit(21).doubled, repr(PostInit(1)), dataclasses.fields(Frozen)[3].compare]


def test_the_methods_are_the_ones_dataclasses_compiles_cold_and_warm(tmp_path):
    plain = _kinds()
    path = str(tmp_path / "table.marshal")
    assert dc.install(path)
    cold = _kinds()
    assert dc._state["new"] and not dc._state["table"]
    dc._write_back()
    dc.uninstall()
    assert dc.install(path)
    warm = _kinds()
    assert dc._state["table"] and not dc._state["new"] and dc._state["used"]
    for made in (cold, warm):
        assert _codes(made) == _codes(plain)
        assert _behaviour(made) == _behaviour(plain)
        for cls, ref in zip(made, plain):  # the same globals: the class's module
            assert cls.__init__.__globals__ is ref.__init__.__globals__


def test_install_once_and_uninstall_leaves_the_builtin(tmp_path):
    import collections

    assert dc.install(str(tmp_path / "t.marshal"))
    assert not dc.install(str(tmp_path / "t.marshal"))
    assert dataclasses.__dict__.get("exec") is dc._exec and collections.__dict__.get("eval") is dc._eval
    dc.uninstall()
    assert "exec" not in dataclasses.__dict__ and "eval" not in collections.__dict__


def _tuples():
    """namedtuple's (and typing.NamedTuple's) classes, made fresh on each call."""
    import collections
    from typing import NamedTuple

    class Typed(NamedTuple):
        a: int
        b: str | None = None

    return (collections.namedtuple("Plain", "x y z", defaults=(0,)), Typed,
            collections.namedtuple("Renamed", ["ok", "def", "ok"], rename=True))


def test_namedtuples_get_the_new_namedtuple_compiles_cold_and_warm(tmp_path):
    plain = _tuples()
    path = str(tmp_path / "t.marshal")
    dc.install(path)
    cold = _tuples()
    assert any(k.startswith(dc._EVAL) for k in dc._state["new"])
    dc._write_back()
    dc.uninstall()
    dc.install(path)
    warm = _tuples()
    assert not dc._state["new"]
    for made in (cold, warm):
        for cls, ref in zip(made, plain):
            assert cls.__new__.__code__ == ref.__new__.__code__ and cls._fields == ref._fields
            assert cls.__new__.__defaults__ == ref.__new__.__defaults__
        assert made[0](1, 2) == (1, 2, 0) and repr(made[1](3)) == "Typed(a=3, b=None)"
        assert made[2](1, 2, 3)._fields == ("ok", "_1", "_2")


HOSTILE = {
    "empty": b"",
    "garbage": b"\x00\xff" * 100,
    "another magic": b"\x01\x02\x03\x04" + b"tierdiag-dataclass-code-1\n0\n" + marshal.dumps({}),
    "cut short": None,  # the real header and half a table
    "a list": None,
    "not code": None,
    "keys not text": None,
    "a code object of another method": None,
}


def _hostile(kind: str) -> bytes:
    head = dc._header()
    if HOSTILE.get(kind) is not None:
        return HOSTILE[kind]
    if kind == "cut short":
        body = marshal.dumps({"def f(): pass": compile("def f(): pass", "<string>", "exec")})
        return head + body[: len(body) // 2]
    if kind == "a list":
        return head + marshal.dumps([1, 2, 3])
    if kind == "not code":
        return head + marshal.dumps({"x": "y", "z": 1})
    if kind == "keys not text":
        return head + marshal.dumps({1: compile("pass", "<string>", "exec")})
    # Well-formed but lying: every text maps to code that is not its own. A table is trusted as
    # the .pyc beside it is (same folder, same writer); this one is not what install() writes.
    return head + marshal.dumps({"never asked": compile("raise SystemExit", "<string>", "exec")})


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_file_that_is_not_a_table_is_ignored_and_replaced(tmp_path, kind):
    path = tmp_path / "table.marshal"
    path.write_bytes(_hostile(kind))
    plain = _kinds()
    dc.install(str(path))
    made = _kinds()
    assert _codes(made) == _codes(plain) and _behaviour(made) == _behaviour(plain)
    dc._write_back()
    dc.uninstall()
    assert dc.load(str(path))  # replaced by a table of what was compiled


@settings(max_examples=40, deadline=None)
@given(names=st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(
           lambda n: n not in ("self", "object", "return", "lambda", "pass", "if", "in", "is", "or", "and",
                               "not", "for", "def", "del", "as", "with", "try", "class", "from", "global",
                               "import", "while", "yield", "else", "elif", "raise", "break", "async",
                               "await", "assert", "except", "finally", "continue", "nonlocal")
           and not n.startswith("__")), min_size=1, max_size=6, unique=True),
       frozen=st.booleans(), order=st.booleans(), defaults=st.integers(0, 6),
       default=st.one_of(st.integers(), st.text(max_size=5), st.none(), st.floats(allow_nan=True)))
def test_any_dataclass_gets_the_methods_dataclasses_compiles(tmp_path_factory, names, frozen, order, defaults, default):
    """Drawn field names, flags and defaults (unicode, NaN, None): the same code objects cold and
    warm as without the table."""
    fields = [(n, object, dataclasses.field(default=default)) if i >= len(names) - defaults else (n, object)
              for i, n in enumerate(names)]

    def make():
        return dataclasses.make_dataclass("Drawn", fields, frozen=frozen, order=order)

    plain = make()
    path = str(tmp_path_factory.mktemp("drawn") / "t.marshal")
    dc.install(path)
    cold = make()
    dc._write_back()
    dc.uninstall()
    dc.install(path)
    warm = make()
    dc.uninstall()
    for cls in (cold, warm):
        assert _codes([cls]) == _codes([plain])


def test_past_max_entries_only_what_was_used_is_kept(tmp_path, monkeypatch):
    path = str(tmp_path / "t.marshal")
    stale = {f"# stale {i}\n": compile(f"x = {i}", "<string>", "exec") for i in range(5)}
    dc.save(path, stale)
    monkeypatch.setattr(dc, "MAX_ENTRIES", 6)
    dc.install(path)
    _kinds()
    dc._write_back()
    dc.uninstall()
    kept = dc.load(path)
    assert not set(stale) & set(kept) and len(kept) > 6


def test_nothing_is_written_where_bytecode_is_not(tmp_path, monkeypatch):
    path = tmp_path / "t.marshal"
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    dc.install(str(path))
    _kinds()
    dc._write_back()
    assert not path.exists()


def test_an_unwritable_place_is_no_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    dc.install(str(blocker / "sub" / "t.marshal"))  # its folder cannot be made: a file is in the way
    _kinds()
    dc._write_back()
    assert blocker.read_text() == "x" and not list(tmp_path.glob("**/*.tmp"))


def test_the_read_commands_print_the_same_with_the_table_cold_and_warm(tmp_path, late_run):
    """`summary` and `explain` in their own processes (the direct path installs the table): cold
    (the table written at exit), warm (read back), and without the table's file being written
    (PYTHONDONTWRITEBYTECODE); each the same output, the table only where bytecode is written."""
    from tests.support.cli import cli_env

    prefix = tmp_path / "pycache"  # sys.pycache_prefix: the .pyc files and the table go there
    base = cli_env(columns=100, PYTHONPYCACHEPREFIX=str(prefix))
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    entry = "import tierdiag.cli.main as m; m.entry()"
    slow = subprocess.run([sys.executable, "-c", entry, "slow", "--db", str(late_run), "--top", "1", "--ids"],
                          env=base, capture_output=True, text=True, timeout=120)
    req = slow.stdout.split()[0]
    for table in prefix.glob("**/dataclass_code.*.marshal"):  # `slow` goes through Typer: no table
        table.unlink()
    outs = {}
    nowrite = {**base, "PYTHONDONTWRITEBYTECODE": "1"}

    def run_all(env):
        return [subprocess.run([sys.executable, "-c", entry, *args, "--db", str(late_run)], env=env,
                               capture_output=True, text=True, cwd=tmp_path, timeout=120)
                for args in (["summary"], ["explain", req], ["explain", req, "--json"])]

    outs["no table"] = run_all(nowrite)
    assert not list(prefix.glob("**/dataclass_code.*.marshal"))
    # Built as compileall builds .pyc files, where bytecode is not written: then read, never grown.
    # Over garbage where the table goes: the build says so in a line and rebuilds it.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "pycache_prefix", str(prefix))
        garbage = dc.cache_path("read")
    os.makedirs(os.path.dirname(garbage), exist_ok=True)
    with open(garbage, "wb") as fh:
        fh.write(b"\x00garbage")
    built = subprocess.run([sys.executable, "-m", "tierdiag.cli.dataclass_code"], env=nowrite, capture_output=True,
                           text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    [said] = built.stderr.splitlines()
    assert said.endswith(f"{garbage}: not a table (no table's header); rebuilt"), said
    [table] = list(prefix.glob("**/dataclass_code.*.marshal"))
    assert str(table) == garbage and len(built.stdout.splitlines()) == len(dc.TABLES)
    before = table.read_bytes()
    outs["built"] = run_all(nowrite)
    assert table.read_bytes() == before
    # The other kinds of run, where bytecode is written: their lazy imports (a data-parallel run's
    # ranks and routing step, a sweep's run its upgrade step, an imported run its twin) are in the
    # built table, so explain (what summary imports on them and more) compiles nothing anew and
    # writes nothing back.
    for db, kind_req in _runs_of_other_kinds(tmp_path, late_run):
        done = subprocess.run([sys.executable, "-c", entry, "explain", kind_req, "--db", str(db), "--json"],
                              env=base, capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert done.returncode == 0 and done.stdout, done.stderr
        assert table.read_bytes() == before, f"explain {kind_req} of {db.stem} compiled methods the built table lacks"
    table.unlink()
    outs["cold"] = run_all(base)
    assert len(dc.load(str(table))) > 100
    outs["warm"] = run_all(base)
    for label in ("built", "cold", "warm"):
        for got, want in zip(outs[label], outs["no table"]):
            assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr), label
    assert all(p.returncode == 0 and p.stdout for p in outs["no table"])



def _runs_of_other_kinds(tmp_path, late_run) -> list:
    """(store, a request to explain) of a data-parallel run (the late trace at --dp 2), a
    sweep's run (late_run's run with a sweep id: explain reads a run's upgrade step by it) and an
    imported (observed) run."""
    import shutil

    import duckdb

    from tests.cli.cli_helpers import REPLAY_ARGS
    from tests.importers.sglang_export import record, write_export
    from tests.support.cli import completed_in_process

    dp = tmp_path / "dp.duckdb"
    done = completed_in_process("replay", late_run.parent / "late.jsonl", "--db", dp, *REPLAY_ARGS, "--dp", "2")
    assert done.returncode == 0, done.stderr
    swept = tmp_path / "swept.duckdb"
    shutil.copy(late_run, swept)
    with duckdb.connect(str(swept)) as con:
        con.execute("UPDATE runs SET sweep_id = 'sweep-t'")
    observed = tmp_path / "observed.duckdb"
    write_export(tmp_path / "export", "20251201_09", [record(f"r{i}", prompt=100 + i, device=64 * (i > 0), arrival_s=i)
                                                       for i in range(4)])
    done = completed_in_process("import", "sglang", tmp_path / "export", "--db", observed)
    assert done.returncode == 0, done.stderr
    out = []
    for db in (dp, swept):
        with duckdb.connect(str(db), read_only=True) as con:
            [(req,)] = con.execute("SELECT req_id FROM requests WHERE status = 'finished' ORDER BY seq LIMIT 1").fetchall()
        out.append((db, req))
    return [*out, (observed, "r1")]


_PROBE = "tierdiag_dc_probe"  # a module of the test's own, imported afresh by each build


def _probe_source(fields: str) -> str:
    return ("import collections, dataclasses\n\n"
            "@dataclasses.dataclass(frozen=True, order=True)\n"
            f"class A:\n    {fields}\n\n"
            "@dataclasses.dataclass\n"
            "class B:\n    x: int = 0\n\n"
            "T = collections.namedtuple('T', 'p q')\n")


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """`build`'s modules made the test's probe module (written in `tmp_path`; `write(fields)`
    changes its class A); each `run(path)` imports it afresh and builds (in this process)."""
    folder = tmp_path / "mods"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setitem(dc.MODULES, "read", (_PROBE,))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no .pyc of the probe: its text is read each time

    class Probe:
        @staticmethod
        def write(fields: str) -> None:
            (folder / f"{_PROBE}.py").write_text(_probe_source(fields))

        @staticmethod
        def run(path) -> int:
            import importlib

            sys.modules.pop(_PROBE, None)
            importlib.invalidate_caches()
            try:
                return dc.build(str(path), "read")
            finally:
                sys.modules.pop(_PROBE, None)

    Probe.write("a: int\n    b: str = 'x'")
    return Probe


def _entries(path) -> list:
    """A table's entries, each marshalled alone (a whole file's bytes also depend on which equal
    strings are one object: its back-references)."""
    return [(k, marshal.dumps(v)) for k, v in dc.load(str(path)).items()]


def test_build_keeps_only_what_its_imports_used(tmp_path, probe, capsys):
    """`build` (as `python -m tierdiag.cli.dataclass_code` runs it, also where bytecode is not
    written): after a class's source changed, the old class's entries are gone, the entries
    still used are kept byte for byte, and the file holds what a fresh build writes (the same
    entries, each the same bytes, in the same order); nothing said on stderr."""
    path = tmp_path / "t.marshal"
    first = probe.run(path)
    before = dc.load(str(path))
    assert first == len(before) > 5
    probe.write("a: int\n    c: float = 1.5")  # A changed: its methods' text changes
    second = probe.run(path)
    after = dc.load(str(path))
    assert second == len(after)
    stale = set(before) - set(after)
    assert stale and all("b" in k for k in stale)  # A's old methods (field b) are gone
    kept = [k for k in before if k in after]
    assert kept and all(marshal.dumps(after[k]) == marshal.dumps(before[k]) for k in kept)  # B's, T's
    fresh = tmp_path / "fresh.marshal"
    probe.run(fresh)
    assert _entries(fresh) == _entries(path)  # a fresh table's content, entry for entry
    assert probe.run(path) == second and _entries(fresh) == _entries(path)  # and stays so
    assert capsys.readouterr().err == ""


def test_build_drops_stale_entries_past_any_count(tmp_path, probe):
    """Stale entries interleaved with the used ones, fewer than MAX_ENTRIES (where a write-back
    keeps them all): a build keeps only the used ones."""
    path = tmp_path / "t.marshal"
    probe.run(path)
    used = dc.load(str(path))
    stale = {f"def __init__(self, gone_{i}):\n  self.gone = {i}\n": compile(f"x = {i}", "<string>", "exec")
             for i in range(7)}
    mixed = {}
    for (k, v), (sk, sv) in zip(used.items(), list(stale.items()) * len(used)):
        mixed[k], mixed[sk] = v, sv
    dc.save(str(path), mixed)
    assert len(mixed) < dc.MAX_ENTRIES
    assert probe.run(path) == len(used)
    assert list(dc.load(str(path))) == list(used)  # the same entries, in the same order


HOSTILE_BUILD = {
    "truncated": ("cut short", lambda head, good: good[: len(head) + (len(good) - len(head)) // 3]),
    "garbage": ("no table's header", lambda head, good: bytes(range(256)) * 4),
    "an old format": ("older format", lambda head, good: good.replace(dc._FORMAT, b"tierdiag-dataclass-code-0\n", 1)),
    "another Python": ("another Python", lambda head, good: b"\x00\x00" + good[2:]),
    "empty": ("empty", lambda head, good: b""),
    "a list": ("not a table (a list)", lambda head, good: head + marshal.dumps([1, 2])),
    "wrong entries": ("2 of its 2 entries not text to code", lambda head, good: head + marshal.dumps({1: 2, "x": "y"})),
}


@pytest.mark.parametrize("kind", list(HOSTILE_BUILD))
def test_build_rebuilds_a_file_that_is_not_a_table_and_says_so_once(tmp_path, probe, capsys, kind):
    path = tmp_path / "t.marshal"
    probe.run(path)
    good = path.read_bytes()
    good_path = str(tmp_path / "good.marshal")
    (tmp_path / "good.marshal").write_bytes(good)
    capsys.readouterr()
    said, spoil = HOSTILE_BUILD[kind]
    path.write_bytes(spoil(dc._header(), good))
    probe.run(path)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and said in err[0] and str(path) in err[0] and err[0].endswith("rebuilt"), err
    assert _entries(path) == [(k, marshal.dumps(v)) for k, v in dc.load(good_path).items()]


def test_build_over_an_unreadable_or_unwritable_table_says_so_and_goes_on(tmp_path, probe, capsys):
    """A folder where the file should be: it can be neither read nor replaced. The build
    imports its modules all the same and says both, a line each; no traceback."""
    path = tmp_path / "t.marshal"
    path.mkdir()
    assert probe.run(path) > 5
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert "unreadable" in err[0] and err[0].endswith("rebuilt") and "not written" in err[1]
    assert path.is_dir() and not list(tmp_path.glob("*.tmp"))
    assert "exec" not in dataclasses.__dict__  # uninstalled all the same


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=300), keep_head=st.booleans())
def test_read_says_why_of_any_bytes_and_never_raises(tmp_path_factory, data, keep_head):
    """Drawn bytes, with or without the real header before them: `read` answers a table (only
    text -> code entries) and either no word or one line, never an exception."""
    path = tmp_path_factory.mktemp("bytes") / "t.marshal"
    body = (dc._header() if keep_head else b"") + data
    path.write_bytes(body)
    table, why = dc.read(str(path))
    assert all(type(k) is str and type(v) is type(compile("", "", "exec")) for k, v in table.items())
    assert why is None or (why and "\n" not in why)
    if not body.startswith(dc._header()):
        assert not table and why
