"""hardware.installed_version: a distribution's version as importlib.metadata.version gives it (the
run row's `torch`), read without importing importlib.metadata where the answer is plain."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierdiag.engine.hardware import installed_version


def metadata_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.parametrize("name", ["torch", "Torch", "numpy", "msgspec", "duckdb", "typer", "rich", "pyarrow",
                                  "no-such-distribution", "typing_extensions", "typing-extensions"])
def test_installed_packages_read_as_importlib_metadata_reads_them(name):
    assert installed_version(name) == metadata_version(name)


def test_torch_version_read_without_importing_importlib_metadata():
    code = ("import sys; from tierdiag.engine.hardware import installed_version; v = installed_version('torch'); "
            "assert 'importlib.metadata' not in sys.modules, 'imported importlib.metadata'; print(v)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == metadata_version("torch")


_header_name = st.sampled_from(["Version", "version", "VERSION", "Versions", "Name", "X-Version"])
_value = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=8)
_header = st.tuples(_header_name, st.sampled_from([":", ": ", ":\t", ":  "]), _value,
                    st.sampled_from(["", " ", "\r"]), st.sampled_from(["", "\n folded", "\n\tfolded"]))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.lists(st.tuples(st.sampled_from(["demo_pkg-1.0.dist-info", "Demo.Pkg-2.0.dist-info",
                                                  "demo-pkg-3.0.egg-info", "demo_pkg-4.0.dist-info"]),
                                 st.lists(_header, max_size=4), st.booleans(), st.booleans()),
                       min_size=1, max_size=3),
       second_path=st.booleans())
def test_drawn_metadata_reads_as_importlib_metadata_reads_it(tmp_path_factory, layout, second_path):
    # Dist-info folders on a path of their own: names spelt differently (normalised alike), one
    # or two candidates, an .egg-info, METADATA with the header in any case, folded, missing, a
    # body after a blank line, or no METADATA at all. Whatever importlib.metadata answers, so
    # does installed_version (from its own reading, or by asking importlib.metadata).
    roots = [tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("site")]
    for i, (folder, headers, with_metadata, body) in enumerate(layout):
        root = roots[i % 2] if second_path else roots[0]
        d = root / folder
        if d.exists():
            continue
        d.mkdir()
        if with_metadata:
            text = "Metadata-Version: 2.1\n" + "".join(f"{k}{sep}{v}{end}{fold}\n" for k, sep, v, end, fold in headers)
            if body:
                text += "\nVersion: 9.9 (in the body, not a header)\n"
            (d / ("METADATA" if folder.endswith(".dist-info") else "PKG-INFO")).write_text(text, encoding="utf-8")
    saved = list(sys.path)
    sys.path[:] = [str(r) for r in roots]
    try:
        for name in ("demo-pkg", "demo_pkg", "Demo.Pkg"):
            assert installed_version(name) == metadata_version(name), name
    finally:
        sys.path[:] = saved
