"""`tierdiag convert`: public session-trace formats to tierdiag's trace format.

One module a format (`kv_cache_tester`, `bailian`), each a generator of whole `SessionRequest`s
that names `file:line` on every error; this module expands the sources, checks the options,
sorts the requests by arrival (a session's turns keep their order) and writes them through
`trace.writer` (atomically: a bad record anywhere leaves no output). Block ids come out
prefix-chained and re-blocked to `block_size` (`records.Rechainer`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tierdiag.errors import ConfigError, TraceError, unknown_name
from tierdiag.paths import same_file
from tierdiag.trace.convert import bailian, kv_cache_tester
from tierdiag.trace.convert.records import ConvertNotes, Rechainer, SessionRequest
from tierdiag.trace.reader import MAX_LENGTH_TOKENS
from tierdiag.trace.writer import write_jsonl

DEFAULT_BLOCK_SIZE = 512  # replay's default: the output replays without --block-size
DEFAULT_START_SPREAD_S = 30.0
REPLAY_DEFAULT_PAGE_SIZE = 64  # replay's --page-size default (config.engine.EngineConfig.page_size)


def replay_options(block_size: int) -> list[str]:
    """The replay options a converted trace needs: `--block-size` unless it is replay's default,
    and then a `--page-size` that divides it (replay takes a power of two dividing the block size;
    the largest such up to replay's default, so pages stay as large as they can)."""
    if block_size == DEFAULT_BLOCK_SIZE:
        return []
    opts = ["--block-size", str(block_size)]
    if block_size % REPLAY_DEFAULT_PAGE_SIZE:
        opts += ["--page-size", str(min(REPLAY_DEFAULT_PAGE_SIZE, block_size & -block_size))]
    return opts


@dataclass(frozen=True, slots=True)
class ConvertOptions:
    block_size: int = DEFAULT_BLOCK_SIZE
    start_spread_s: float | None = None  # kv-cache-tester only; None: DEFAULT_START_SPREAD_S
    seed: int = 0


@dataclass(frozen=True, slots=True)
class _Format:
    read: Callable[..., Iterator[SessionRequest]]
    file_glob: str  # what a folder given as a source contributes (recursively, sorted)
    takes_start_spread: bool


FORMATS: dict[str, _Format] = {
    "kv-cache-tester": _Format(kv_cache_tester.read, "*.json", True),
    "bailian": _Format(bailian.read, "*.jsonl*", False),
}


@dataclass(frozen=True, slots=True)
class ConvertSummary:
    path: str
    format: str
    num_files: int
    num_requests: int
    num_sessions: int
    block_size: int
    span_s: float
    notes: ConvertNotes

    def to_json(self) -> dict:
        return {"path": self.path, "format": self.format, "num_files": self.num_files,
                "num_requests": self.num_requests, "num_sessions": self.num_sessions,
                "block_size": self.block_size, "span_s": round(self.span_s, 3), **self.notes.to_json()}


PROGRESS_EVERY = 1000  # requests between two progress calls


def convert(fmt: str, sources: list[Path], out: Path, options: ConvertOptions = ConvertOptions(),
            progress: Callable[[str, int, int | None], None] | None = None) -> ConvertSummary:
    """Read `sources` (files, or folders of them) in format `fmt`; write one session trace to `out`.
    `progress(phase, done, total)`: every PROGRESS_EVERY requests, phase "read" (no total yet)
    then "write" (of all the requests)."""
    spec = FORMATS.get(fmt)
    if spec is None:
        raise unknown_name("format", fmt, FORMATS)
    if not 1 <= options.block_size <= MAX_LENGTH_TOKENS:
        raise ConfigError(f"--block-size must be 1 to {MAX_LENGTH_TOKENS:,} tokens, got {options.block_size}")
    if options.start_spread_s is not None and not spec.takes_start_spread:
        raise ConfigError(f"--start-spread applies to kv-cache-tester traces only ({fmt} timestamps are absolute)")
    spread = DEFAULT_START_SPREAD_S if options.start_spread_s is None else options.start_spread_s
    if not 0 <= spread <= kv_cache_tester.MAX_START_S:  # NaN fails too
        raise ConfigError(f"--start-spread must be 0 to {kv_cache_tester.MAX_START_S:,} seconds, got {spread:g}")
    files = _expand(sources, spec.file_glob)
    _refuse_overwrite(out, sources, files)

    rechain = Rechainer(options.block_size)
    notes = ConvertNotes()
    kwargs = {"start_spread_s": spread, "seed": options.seed} if spec.takes_start_spread else {}
    requests = []
    for req in spec.read(files, rechain=rechain, notes=notes, **kwargs):
        requests.append(req)
        if progress is not None and len(requests) % PROGRESS_EVERY == 0:
            progress("read", len(requests), None)
    if not requests:
        raise TraceError(f"{sources[0]}: no requests in the input" if len(sources) == 1 else
                         f"no requests in the {len(files)} input files")
    notes.unchained_blocks = len(rechain.unchained_ids)
    notes.unchained_block_uses = rechain.unchained
    # Sorted by arrival; ties keep reading order, so a session's turns stay in order.
    order = sorted(range(len(requests)), key=lambda i: requests[i].timestamp_ms)
    write_jsonl(out, _lines(requests, order, progress), what="-o",
                inputs=[("the input", f) for f in [*sources, *files]])
    first, last = requests[order[0]].timestamp_ms, requests[order[-1]].timestamp_ms
    return ConvertSummary(path=str(out), format=fmt, num_files=len(files), num_requests=len(requests),
                          num_sessions=len({r.session for r in requests}), block_size=options.block_size,
                          span_s=(last - first) / 1000, notes=notes)


def _lines(requests: list[SessionRequest], order: list[int], progress) -> Iterator[str]:
    for n, i in enumerate(order, 1):
        yield requests[i].to_json_line()
        if progress is not None and n % PROGRESS_EVERY == 0:
            progress("write", n, len(order))


def _expand(sources: list[Path], glob: str) -> list[Path]:
    files: list[Path] = []
    for src in sources:
        if src.is_dir():
            found = sorted(p for p in src.rglob(glob) if p.is_file())
            if not found:
                raise TraceError(f"{src}: no {glob} files in this folder")
            files.extend(found)
        elif src.exists():
            files.append(src)
        else:
            raise TraceError(f"{src}: no such file or folder")
    return files


def _refuse_overwrite(out: Path, sources: list[Path], files: list[Path]) -> None:
    """The output is written last and replaces its path: it must not be one of the inputs."""
    for src in [*sources, *files]:
        if same_file(out, src):  # a link loop is no input (paths.same_file)
            raise ConfigError(f"-o {out} is the input {src}: convert would overwrite it",
                              hint="write the trace to another file")
