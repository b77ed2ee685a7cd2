"""A request is named by what it mostly was (its own token shares), not only by its hit class:
a `device_hit` that was 14 % device and 57 % recomputed reads as "mostly recomputed"."""

from __future__ import annotations

import json

from tests.cli.cli_helpers import cli_here
from tierdiag.diagnose.request.explain import TokenSplit


def split(device=0, host=0, storage=0, computed=0, recomputed=0) -> TokenSplit:
    return TokenSplit(input_tokens=device + host + storage + computed, device_tokens=device, host_tokens=host,
                      storage_tokens=storage, computed_tokens=computed, recomputed_tokens=recomputed)


def test_label_follows_the_largest_share():
    assert split(device=512, computed=16_896 + 173, recomputed=16_896).label() == \
        "mostly recomputed: 96 % of its input"
    assert split(device=100).label() == "all on the device"
    assert split(computed=100).label() == "a miss: all new tokens"
    assert split(host=6_144, computed=29).label() == "mostly loaded back from host: 99.5 % of its input"
    assert split(device=512, computed=5_814).label() == "mostly new: 92 % of its input"
    assert split(device=40, host=30, computed=30).label() == "largest part on the device: 40 % of its input"


def test_explain_names_a_mostly_recomputed_device_hit_so(late_run):
    res = cli_here("slow", "--db", late_run, "--class", "device_hit", "--json", "--top", "300")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["requests"]
    req = next(r["req_id"] for r in rows
               if r["recomputed_tokens"] * 2 > r["input_tokens"])
    e = json.loads(cli_here("explain", req, "--db", late_run, "--json").stdout)
    assert e["class"] == "device_hit"
    assert e["verdict"].startswith(f"Request {req} (mostly recomputed: ")
    text = cli_here("explain", req, "--db", late_run, columns=100).stdout
    assert "device_hit, mostly recomputed" in " ".join(text.split())


def test_headline_calls_a_mostly_new_request_no_full_device_hit():
    from tierdiag.diagnose.request.claims import cache_context

    assert cache_context(split(device=512, computed=5_814), short=True) == "its input was 8 % device, 92 % new"
    assert cache_context(split(device=6_144, computed=29), short=True) == "the cache was a full device hit"
