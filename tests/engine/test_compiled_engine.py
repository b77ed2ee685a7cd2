"""The compiled engine core (mypyc, setup.py; tierdiag/engine/compiled.py) against its Python
twin, the same modules' source (issue 41): every table, every column, on both Mooncake traces'
slices, a session trace, a `--dp 4` run and a storage run, and on Hypothesis-generated streams.

The pure twin runs in a subprocess with TIERDIAG_PURE_ENGINE=1 (a process decides its engine
once, at its first import of tierdiag.engine). Without a compiled build here the comparisons
skip and say why; the switch and the import hook are tested either way."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierdiag.engine import compiled

REPO = Path(__file__).resolve().parents[2]
SHARED_TRACES = REPO / ".." / "shared" / "traces"
TABLES = ("requests", "evictions", "request_evictions", "batches", "transfers", "pool_samples")
MEASURED = ("run_id", "wall_ns", "data_plane_bytes", "verified")  # benchmarks/compare_rows.py's

needs_compiled = pytest.mark.skipif(not compiled.is_compiled(),
                                    reason=f"the engine core is not compiled here: {compiled.describe()['why']}")


def _env(pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != compiled.ENV}
    if pure:
        env[compiled.ENV] = "1"
    return env


def _mode(pure: bool) -> dict:
    code = "import json\nfrom tierdiag.engine import compiled, tree\nprint(json.dumps([compiled.describe(), tree.__file__]))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=_env(pure))
    assert proc.returncode == 0, proc.stderr
    described, tree_file = json.loads(proc.stdout)
    return {**described, "tree_file": tree_file}


def test_the_switch_runs_the_python_twin_and_says_why():
    """TIERDIAG_PURE_ENGINE=1: every compiled module comes from its .py file (the import hook),
    and describe() says it was asked for."""
    pure = _mode(True)
    assert pure["mode"] == "pure"
    assert pure["why"].startswith("asked")
    assert pure["tree_file"].endswith("tree.py")


def test_the_default_is_the_compiled_core_where_it_is_built(monkeypatch):
    """A child started without TIERDIAG_PURE_ENGINE runs what this build decides without it (not
    this process's mode: the suite may itself run on the twin, TIERDIAG_PURE_ENGINE=1)."""
    default = _mode(False)
    monkeypatch.delenv(compiled.ENV, raising=False)
    assert default["mode"] == compiled._decide()[0]
    if default["mode"] == "compiled":
        assert not default["tree_file"].endswith(".py")
        assert set(default["modules"]) == set(compiled.MODULES)
    else:  # says why: not built, stale, missing extensions
        assert default["why"]


def test_a_changed_source_makes_the_build_stale(tmp_path, monkeypatch):
    """A build whose source changed since would run old code: the twin runs instead, and says
    which file (decided from _compiled.json's digests)."""
    manifest = {"compiled": True, "mypy": "x", "sources": {m: "0" * 64 for m in compiled.MODULES}}
    (tmp_path / "_compiled.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(compiled, "MANIFEST", tmp_path / "_compiled.json")
    monkeypatch.delenv(compiled.ENV, raising=False)
    mode, why, _ = compiled._decide()
    if all(compiled._extension(m) for m in compiled.MODULES) and compiled._extension("_compiled__mypyc"):
        assert (mode, why.split(":")[0]) == ("pure", "stale build")
    else:
        assert mode == "pure" and "missing" in why


def test_a_subpackage_module_is_held_to_its_own_source(tmp_path, monkeypatch):
    """routing/approx_tree.py is compiled as `routing.approx_tree` (session 18, h41route): its
    digest is checked against tierdiag/engine/routing/approx_tree.py, its extension looked for in
    routing/, and a change of that file alone makes the build stale, naming it."""
    assert compiled.source_path("routing.approx_tree") == compiled.HERE / "routing" / "approx_tree.py"
    assert compiled.source_path("arrivals") == compiled.HERE / "arrivals.py"
    sources = {m: compiled.source_digest(compiled.source_path(m)) for m in compiled.MODULES}
    sources["routing.approx_tree"] = "0" * 64
    (tmp_path / "_compiled.json").write_text(json.dumps({"compiled": True, "mypy": "x", "sources": sources}))
    monkeypatch.setattr(compiled, "MANIFEST", tmp_path / "_compiled.json")
    monkeypatch.delenv(compiled.ENV, raising=False)
    mode, why, modules = compiled._decide()
    assert "routing.approx_tree" in modules and mode == "pure"
    if all(compiled._extension(m) for m in compiled.MODULES) and compiled._extension("_compiled__mypyc"):
        assert why.startswith("stale build: routing/approx_tree.py changed"), why
        assert compiled._extension("routing.approx_tree").parent == compiled.HERE / "routing"
    else:
        assert "missing" in why


def _built() -> bool:
    return all(compiled._extension(m) for m in compiled.MODULES) and compiled._extension("_compiled__mypyc") is not None


def test_a_source_as_built_is_not_hashed_and_a_touched_one_is(tmp_path, monkeypatch):
    """The build records each source's size and modification time beside its digest: a source
    whose stat is the build's is taken as compiled without reading it (no SHA-256, no OpenSSL at
    a replay's start, issue 41), as Python takes a .pyc; one whose stat differs is hashed, and
    runs compiled when its bytes are the build's (a `touch`), stale when not."""
    sources = {m: compiled.source_digest(compiled.source_path(m)) for m in compiled.MODULES}
    stats = {m: compiled.source_stat(compiled.source_path(m)) for m in compiled.MODULES}
    monkeypatch.setattr(compiled, "MANIFEST", tmp_path / "_compiled.json")
    monkeypatch.delenv(compiled.ENV, raising=False)
    hashed: list[Path] = []
    digest = compiled.source_digest
    monkeypatch.setattr(compiled, "source_digest", lambda path: hashed.append(path) or digest(path))

    def decide(sources: dict, stats: dict) -> tuple[str, str]:
        hashed.clear()
        (tmp_path / "_compiled.json").write_text(json.dumps({"compiled": True, "mypy": "x", "sources": sources,
                                                             "stats": stats}))
        mode, why, _ = compiled._decide()
        return mode, why

    if not _built():
        assert decide(sources, stats)[0] == "pure"
        return
    assert decide(sources, stats)[0] == "compiled" and hashed == []
    # A touched source (another time, the same bytes): hashed, and still the build's.
    touched = dict(stats, tree=[stats["tree"][0], stats["tree"][1] + 1])
    assert decide(sources, touched)[0] == "compiled" and hashed == [compiled.source_path("tree")]
    # Another size and another digest: stale, naming the file.
    changed = dict(stats, tree=[stats["tree"][0] + 1, stats["tree"][1]])
    mode, why = decide(dict(sources, tree="0" * 64), changed)
    assert mode == "pure" and why.startswith("stale build: tree.py changed"), why
    # A manifest without stats (an older build's) hashes every source, as before.
    assert decide(sources, {})[0] == "compiled" and len(hashed) == len(compiled.MODULES)


def test_the_source_as_it_is_compiles_where_mypyc_is_installed():
    """mypyc refusing the engine's source (a mixin's new attribute not declared in
    SchedulerState, an annotation mypy rejects) leaves the Python twin running: every test still
    passes and the compiled core is silently gone. Where the build had mypyc, it must have
    compiled this source: a refusal fails here with the build's reason."""
    try:
        manifest = json.loads(compiled.MANIFEST.read_text())
    except FileNotFoundError:
        pytest.skip("not built by setup.py (no _compiled.json)")
    why = str(manifest.get("why") or "")
    if "mypyc was not installed" in why or "was set at build time" in why:
        pytest.skip(why)
    assert "refused" not in why, why
    if manifest.get("compiled"):
        stale = [m for m, digest in manifest["sources"].items()
                 if compiled.source_digest(compiled.source_path(m)) != digest]
        assert not stale, f"the build is older than {stale}: rebuild (python setup.py build_ext --inplace)"


@pytest.mark.parametrize("manifest, says", [(None, "no _compiled.json"), ("{not json", "unreadable"),
                                            ({"compiled": False, "why": "not compiled: mypyc was not installed"},
                                             "mypyc was not installed")])
def test_a_build_without_mypyc_or_a_manifest_runs_the_twin(tmp_path, monkeypatch, manifest, says):
    path = tmp_path / "_compiled.json"
    if manifest is not None:
        path.write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    monkeypatch.setattr(compiled, "MANIFEST", path)
    monkeypatch.delenv(compiled.ENV, raising=False)
    mode, why, _ = compiled._decide()
    assert mode == "pure" and says in why


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20))
def test_any_value_of_the_switch_decides_without_failing(monkeypatch, value):
    """TIERDIAG_PURE_ENGINE: unset, empty or 0 keep the default; any other value (hostile ones
    included) asks for the twin, and the reason quotes it without failing."""
    monkeypatch.setenv(compiled.ENV, value)
    mode, why, _ = compiled._decide()
    if value in ("", "0"):
        assert not why.startswith("asked")
    else:
        assert (mode, why.split(" ")[0]) == ("pure", "asked")


# --- replays, compiled and pure, every table compared -------------------------------------------

def _replay(trace: Path, db: Path, args: list[str], *, pure: bool) -> None:
    proc = subprocess.run([sys.executable, "-c", "from tierdiag.cli.main import entry; entry()", "replay", str(trace),
                           "--db", str(db), *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO, env=_env(pure))
    assert proc.returncode == 0, proc.stderr[-2000:]


def differences(a: Path, b: Path) -> dict[str, tuple[int, int, int]]:
    """benchmarks/compare_rows.py's comparison: each table's rows, every column but the measured
    ones, as multisets both ways: {table: (rows, only in a, only in b)}."""
    con = duckdb.connect()
    out = {}
    for name, path in (("a", a), ("b", b)):
        con.execute(f"ATTACH '{path}' AS {name} (READ_ONLY)")
    for t in TABLES:
        cols = ", ".join(r[0] for r in con.execute(f"DESCRIBE a.{t}").fetchall() if r[0] not in MEASURED)
        n = con.execute(f"SELECT count(*) FROM a.{t}").fetchone()[0]
        only = [con.execute(f"SELECT count(*) FROM (SELECT {cols} FROM {x}.{t} EXCEPT ALL "
                            f"SELECT {cols} FROM {y}.{t})").fetchone()[0] for x, y in (("a", "b"), ("b", "a"))]
        out[t] = (n, *only)
    return out


def _head(src: Path, n: int, dst: Path) -> Path:
    with src.open() as f, dst.open("w") as out:
        for i, line in enumerate(f):
            if i >= n:
                break
            out.write(line)
    return dst


SAMPLE = REPO / "tierdiag" / "trace" / "samples" / "demo.jsonl"
SCENARIOS = {
    # name: (trace, lines, replay options)
    "conversation": ("conversation_trace.jsonl", 1500, []),
    "synthetic": ("synthetic_trace.jsonl", 1000, []),
    "conversation-dp4": ("conversation_trace.jsonl", 1500, ["--dp", "4", "--router", "cache_aware"]),
    "synthetic-storage": ("synthetic_trace.jsonl", 1000, ["--storage-tokens", "20000000", "--device-tokens", "200000",
                                                         "--host-tokens", "400000"]),
    "sessions-closed": (None, None, ["--arrivals", "closed", "--device-tokens", "98304", "--host-tokens", "393216"]),
}


@needs_compiled
@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_compiled_and_pure_engines_record_identical_rows(tmp_path, name):
    trace_name, lines, args = SCENARIOS[name]
    if trace_name is None:
        trace = SAMPLE
    else:
        src = SHARED_TRACES / trace_name
        if not src.is_file():
            pytest.skip(f"needs ../shared/traces/{trace_name}")
        trace = _head(src, lines, tmp_path / trace_name)
    _replay(trace, tmp_path / "compiled.duckdb", args, pure=False)
    _replay(trace, tmp_path / "pure.duckdb", args, pure=True)
    diff = differences(tmp_path / "compiled.duckdb", tmp_path / "pure.duckdb")
    assert diff["requests"][0] > 0
    assert {t: d[1:] for t, d in diff.items()} == {t: (0, 0) for t in TABLES}, diff


# --- generated streams: one pure worker process, the compiled engine in this one -----------------

_WORKER = r"""
import pickle, sys
from tierdiag.engine import compiled
assert compiled.describe()["mode"] == "pure", compiled.describe()
from tests.engine.test_compiled_engine import run_stream
while True:
    msg = pickle.load(sys.stdin.buffer)
    if msg is None:
        break
    try:
        out = ("ok", run_stream(*msg))
    except Exception as exc:  # the comparison is of outcomes: an error is one too
        out = ("error", f"{type(exc).__name__}: {exc}")
    pickle.dump(out, sys.stdout.buffer)
    sys.stdout.buffer.flush()
"""


def run_stream(cfg_kw: dict, stream: list[tuple]) -> dict:
    """Replay `stream` in this process's engine with the recorder; every table's columns as lists,
    the measured ones left out."""
    from tierdiag.probes.recorder import Recorder
    from tests.engine.helpers import numbered, req, small_config
    from tierdiag.engine.engine import Engine

    got: dict[str, dict[str, list]] = {}

    def sink(tables):
        for table, cols in tables.items():
            into = got.setdefault(table, {})
            for col, values in cols.items():
                if col not in MEASURED:
                    into.setdefault(col, []).extend(values)

    reqs = numbered([req(f"r{i}", t_ms, pages, output=out, extra_tokens=extra)
                     for i, (t_ms, pages, out, extra) in enumerate(stream)])
    probe = Recorder(sink=sink)
    Engine(small_config(**cfg_kw), probe=probe).run(reqs)
    probe.flush()
    return got


@pytest.fixture(scope="module")
def pure_worker():
    proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            cwd=REPO, env=_env(True))
    yield proc
    pickle.dump(None, proc.stdin)
    proc.stdin.close()
    proc.wait(timeout=60)


_streams = st.lists(st.tuples(st.floats(0, 50, allow_nan=False), st.lists(st.integers(0, 24), min_size=1, max_size=12),
                              st.integers(1, 200), st.integers(0, 63)), min_size=1, max_size=30)
_configs = st.fixed_dictionaries({
    "device_tokens": st.sampled_from([8 * 64, 16 * 64, 48 * 64]),
    "host_tokens": st.sampled_from([None, 32 * 64, 96 * 64]),
    "write_policy": st.sampled_from(["write_through", "write_back", "write_through_selective"]),
    "sglang_rules": st.sampled_from(["0.5.9", "0.5.23"]),
    "eviction_policy": st.sampled_from(["lru", "lfu", "fifo", "mru", "priority"]),
    "schedule_policy": st.sampled_from(["fcfs", "lpm", "hrrn", "shortest-prefill-first"]),
    "dp": st.sampled_from([1, 2]),
})


@needs_compiled
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg_kw=_configs, stream=_streams)
def test_generated_streams_record_identical_rows(pure_worker, cfg_kw, stream):
    try:
        here = ("ok", run_stream(cfg_kw, stream))
    except Exception as exc:  # a config the engine refuses: the twin must refuse it the same way
        here = ("error", f"{type(exc).__name__}: {exc}")
    pickle.dump((cfg_kw, stream), pure_worker.stdin)
    pure_worker.stdin.flush()
    there = pickle.load(pure_worker.stdout)
    assert here == there
