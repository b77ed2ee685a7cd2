"""SGLang's per-request metrics export, its files: which files under the given paths are an
export (SGLang's file name, in time order), and the records they hold, read line by line into
typed `SGLangRequest`s (the format and the decoding of one record: sglang.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import msgspec

from tierdiag.errors import TraceError
from tierdiag.trace.lines import BadLine, numbered_lines, skip_bad_line
from tierdiag.importers.sglang import (EXPORT_FILE_RE, EXPORT_GLOBS, SIGNATURE_KEYS, ImportReport, SGLangRequest,
                                       decode_record, to_request)


def export_files(paths: list[str | os.PathLike]) -> list[Path]:
    """The export files under `paths` (files as given, folders by SGLang's file name), in time order.

    Time order is the hour in the name (when the requests finished); files whose name has no
    hour keep the order they were given in, after those that do.
    """
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            inside = sorted({f for g in EXPORT_GLOBS for f in p.glob(g) if f.is_file()})
            if not inside:
                raise TraceError(f"{p}: no sglang-request-metrics-*.log files in this folder",
                                 hint=f"SGLang writes them with --export-metrics-to-file "
                                      f"--export-metrics-to-file-dir {p}")
            found.extend(inside)
        elif p.exists():
            found.append(p)
        else:
            raise TraceError(f"{p}: no such file or folder")
    unique: dict[Path, Path] = {}
    for f in found:
        unique.setdefault(f.resolve(), f)
    files = list(unique.values())

    def key(item: tuple[int, Path]):
        i, f = item
        m = EXPORT_FILE_RE.match(f.name)
        # .log before .log.gz of the same hour only for determinism; both are read.
        return (0, m.group(1), f.name, i) if m else (1, "", "", i)

    return [f for _, f in sorted(enumerate(files), key=key)]


def read_export(paths: list[str | os.PathLike], *, with_tokens: bool = False, skip_bad: bool = False,
                report: ImportReport | None = None) -> Iterator[SGLangRequest]:
    """Yield every exported request of the files under `paths`, files in time order, lines in
    file order (= finish order).

    `with_tokens` also decodes request_parameters (input_ids, text, stream): the slow part, only
    needed to write a trace. A bad line raises TraceError naming `file:line`; with `skip_bad`
    it is counted in `report` instead. A file whose first record is JSON but not an SGLang
    export record is refused whatever `skip_bad` says: it is the wrong file, not a bad line.
    """
    files = export_files(paths)
    report = report if report is not None else ImportReport()
    report.files = [str(f) for f in files]
    return _read(files, with_tokens, skip_bad, report)


def _read(files: list[Path], with_tokens: bool, skip_bad: bool, report: ImportReport) -> Iterator[SGLangRequest]:
    # id -> where it was first seen, packed as file index << 32 | line (an int, not a string:
    # this map is the importer's one per-request structure, so it is kept small).
    seen: dict[str, int] = {}
    for file_index, path in enumerate(files):
        name = str(path)
        recognised = False
        for lineno, data in numbered_lines(path, what="export"):
            report.bytes_read += len(data)
            if not data.strip():
                continue
            try:
                if lineno == 1 and data.startswith(b"\xef\xbb\xbf"):
                    data = data[3:]
                try:
                    rec = decode_record(data)
                except BadLine:
                    if not data.endswith(b"\n") and recognised:
                        # The file's last line, cut short: FileRequestMetricsExporter.write_file
                        # writes a line, then "\n", then flushes, so this is a record still being
                        # written (an export read while the server runs) or cut by a crash.
                        report.incomplete_tails.append(f"{name}:{lineno}")
                        continue
                    if not recognised:
                        _check_is_export(path, data)
                    raise
                if not recognised:
                    if rec.id is msgspec.UNSET and rec.prompt_tokens is msgspec.UNSET:
                        raise _not_export(path, data)
                    recognised = True
                req = to_request(rec, name, lineno, with_tokens, report)
                first = seen.get(req.req_id)
                if first is not None:
                    raise BadLine(f"duplicate request id {req.req_id!r} (first at {files[first >> 32]}:"
                                   f"{first & 0xFFFFFFFF})")
            except BadLine as exc:
                report.bad_lines += 1
                if skip_bad_line(name, lineno, exc, skip_bad, report.bad_lines):
                    report.first_bad.append(f"{name}:{lineno}: {exc}")
                continue
            seen[req.req_id] = file_index << 32 | lineno
            report.num_records += 1
            yield req


def _not_export(path: Path, data: bytes) -> TraceError:
    head = data[:200]
    looks_like_trace = b'"hash_ids"' in head or b'"input_length"' in head or b'"tokens"' in head
    hint = ("it looks like a workload trace: replay it with `tierdiag replay`" if looks_like_trace
            else "expected the sglang-request-metrics-*.log files SGLang writes with --export-metrics-to-file")
    return TraceError(f"{path}: not an SGLang request-metrics export (its first record has no "
                      f"{', '.join(repr(k) for k in SIGNATURE_KEYS)})", hint=hint)


def _check_is_export(path: Path, data: bytes) -> None:
    """A first line that does not even decode: say 'not an export' when it is not JSON at all."""
    stripped = data.lstrip()
    if not stripped.startswith(b"{"):
        if b"\x00" in data[:512]:
            raise TraceError(f"{path}: not an SGLang request-metrics export (binary data)",
                             hint="expected one JSON object a line") from None
        if not stripped.startswith((b"[", b'"')):
            raise TraceError(f"{path}: not an SGLang request-metrics export (its first line is not JSON)",
                             hint="expected one JSON object a line, as --export-metrics-to-file writes")
