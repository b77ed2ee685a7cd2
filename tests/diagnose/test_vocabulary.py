"""`explain` speaks the SGLang release the run followed (issue 29, item 3), and `runs`, `summary`
and the report say which release that was.

The same planted request (`tier`: 2,048 tokens loaded back from host) is explained three times:
recorded under `--sglang 0.5.23`, under `--sglang 0.5.9`, and by a store written before rule sets
existed (no `sglang_rules` in its config: the engine followed 0.5.9 then). Under 0.5.23 the
request's fields are `prefix_len`, `host_loaded_length`, `kv.cache_protected_len` (0.5.23's
`Req`: `prefix_indices` is gone since 0.5.22; `schedule_batch.split_cached_prefix_by_tier`
counts host = min(host_hit_length, host_loaded_length)); under 0.5.9 `prefix_indices` and
`host_hit_length` (`ScheduleBatch.prepare_for_extend` counts the promised hit). The JSON keys
and step names are the contract's either way (DESIGN.md §3).
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from tests.cli.cli_helpers import cli_here
from tierdiag.diagnose.request.explain import explain_request
from tierdiag.diagnose.run.summary import run_summary
from tierdiag.report.runs_view import render_runs
from tierdiag.report.run_lines import rules_line
from tierdiag.report.terminal import render_explanation, render_summary
from tierdiag.store.reader import RunInfo, open_store, resolve_run

from .conftest import CONFIG, RunBuilder, plant_scenarios


def _store(tmp_path, rules: str | None) -> RunBuilder:
    config = dict(CONFIG)
    if rules is not None:
        config["sglang_rules"] = rules
    b = plant_scenarios(RunBuilder(tmp_path / f"planted-{rules}.duckdb", config=config))
    b.write()
    return b


def _explain(b: RunBuilder, req_id: str = "tier"):
    with open_store(b.path) as con:
        return explain_request(con, resolve_run(con, None), req_id)


def _text(fn, *args, **kwargs) -> str:
    buf = io.StringIO()
    fn(*args, Console(file=buf, width=120, color_system=None), **kwargs)
    return buf.getvalue()


def test_0523_run_is_explained_in_0523s_words(tmp_path):
    e = _explain(_store(tmp_path, "0.5.23"))
    host, prefix = e.steps[0].finding, e.steps[1].finding
    assert "loaded back from host (host_loaded_length 2,048)" in host
    assert "(Fields as SGLang 0.5.23 names them: host_loaded_length.)" in host
    assert "usable prefix (prefix_len) 2,048 tokens" in prefix and "kv.cache_protected_len 2,048" in prefix
    assert "(Fields as SGLang 0.5.23 names them: prefix_len, kv.cache_protected_len.)" in prefix
    for finding in (host, prefix):
        assert "prefix_indices" not in finding and "host_hit_length" not in finding

    j = e.to_json()
    assert j["sglang_rules"] == "0.5.23"
    assert j["vocabulary"] == {"prefix_indices": "prefix_len", "prefix_indices_len": "prefix_len",
                               "host_hit_length": "host_loaded_length", "last_host_node": "best_match_node",
                               "cache_protected_len": "kv.cache_protected_len"}
    # The contract does not move: step names and evidence keys are DESIGN.md §3's.
    assert [s["name"] for s in j["steps"]] == ["host_hit_length", "prefix_indices", "load_back", "eviction"]
    assert j["steps"][0]["evidence"]["host_hit_length"] == 2048
    assert j["steps"][1]["evidence"]["prefix_indices_len"] == 2048

    text = _text(render_explanation, e)
    assert "1 · host_loaded_length" in text and "2 · prefix_len" in text and "sglang 0.5.23" in text
    assert "host_hit_length" not in text and "prefix_indices" not in text


@pytest.mark.parametrize("rules", ["0.5.9", None], ids=["recorded-0.5.9", "before-rule-sets"])
def test_059_run_is_explained_in_059s_words(tmp_path, rules):
    e = _explain(_store(tmp_path, rules))
    host, prefix = e.steps[0].finding, e.steps[1].finding
    assert "loaded back from host (host_hit_length 2,048)" in host
    assert "(Fields as SGLang 0.5.9 names them: host_hit_length.)" in host
    assert "usable prefix (len(prefix_indices)) 2,048 tokens" in prefix and "; cache_protected_len 2,048" in prefix
    for finding in (host, prefix):
        assert "host_loaded_length" not in finding and "prefix_len)" not in finding

    j = e.to_json()
    assert j["sglang_rules"] == "0.5.9"
    assert j["vocabulary"]["host_hit_length"] == "host_hit_length"
    assert j["vocabulary"]["prefix_indices"] == "prefix_indices"
    assert j["vocabulary"]["last_host_node"] == "last_host_node"

    text = _text(render_explanation, e)
    assert "1 · host_hit_length" in text and "2 · prefix_indices" in text and "sglang 0.5.9" in text
    assert "host_loaded_length" not in text


def test_an_empty_prefix_is_named_in_the_runs_words(tmp_path):
    new, old = _explain(_store(tmp_path, "0.5.23"), "miss"), _explain(_store(tmp_path, "0.5.9"), "miss")
    assert new.steps[1].finding.startswith("no usable prefix: prefix_len is 0 (kv.cache_protected_len 0)")
    assert old.steps[1].finding.startswith("no usable prefix: len(prefix_indices) is 0 (cache_protected_len 0)")


def _info(config: dict, kind: str = "replay") -> RunInfo:
    return RunInfo(run_id="20261201-120000-abcdef", name="r", created_at="2026-12-01 12:00:00", status="complete",
                   tierdiag_version="0", trace_path="t.jsonl", trace_sha256="", config=config, hardware={},
                   data_plane={}, timing="modelled", num_requests=5, wall_s=None, command_line="", kind=kind)


def test_runs_shows_the_rule_set_and_an_old_run_as_059():
    infos = [_info({**CONFIG, "sglang_rules": "0.5.23"}), _info({**CONFIG, "sglang_rules": "0.5.9"}), _info(dict(CONFIG)),
             _info({"source": "sglang"}, kind="observed")]
    assert [rules_line(i) for i in infos] == ["sglang 0.5.23", "sglang 0.5.9",
                                              "sglang 0.5.9 (recorded before rule sets)", None]
    console = Console(width=80, record=True, color_system=None)
    # `sglang_rules=0.5.9` differs from the default but has its own line, not an option line.
    render_runs(infos[1:2], console, db_label="x.duckdb", options={infos[1].run_id: {"sglang_rules": "0.5.9"}})
    text = console.export_text()
    assert "sglang 0.5.9" in text and "sglang_rules=" not in text


def test_summary_says_the_rule_set(tmp_path):
    b = _store(tmp_path, "0.5.23")
    with open_store(b.path) as con:
        run = resolve_run(con, None)
        text = _text(render_summary, run_summary(con, run), rules=rules_line(run))
    head = text.splitlines()[:4]
    assert "engine rules: sglang 0.5.23" in head, head


def test_cli_summary_and_runs_json_name_the_rule_set_old_store_as_059(tmp_path):
    old, new = _store(tmp_path, None), _store(tmp_path, "0.5.23")
    for b, want in ((old, "0.5.9"), (new, "0.5.23")):
        res = cli_here("summary", "--db", b.path, "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["sglang_rules"] == want
        res = cli_here("runs", "--db", b.path, "--json")
        assert [r["sglang_rules"] for r in json.loads(res.stdout)] == [want]
    res = cli_here("summary", "--db", old.path)
    assert "engine rules: sglang 0.5.9 (recorded before rule sets)" in res.stdout, res.stdout


@pytest.mark.parametrize("rules,shown", [("0.5.23", "sglang <b>0.5.23</b> ·"),
                                         (None, "sglang <b>0.5.9</b> (recorded before rule sets)")])
def test_the_reports_run_header_names_the_rule_set(tmp_path, rules, shown):
    from tierdiag.report.html import build_report

    b = _store(tmp_path, rules)
    res = build_report(b.path, output=tmp_path / "r.html")
    text = res.path.read_text()
    header = text[text.index('<header class="top"'):text.index("</header>")]
    assert shown in header
