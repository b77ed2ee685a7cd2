"""Reader for SGLang's per-request metrics export (`--export-metrics-to-file`), SGLang 0.5.23.

The format and one record's decoding into a typed `SGLangRequest`, with `file:line` on every
error; the files and the generator over them are sglang_export.py's (`read_export`); nothing
here writes a store (importers/load.py does).

The format, as SGLang writes it (read from its source, not guessed)::

    DIR/sglang-request-metrics-20261201_09.log       # the hour the request *finished*, server local time
    {"request_parameters": "{\\"rid\\": \\"9c1f..\\", \\"input_ids\\": [128000, ...], ...}",
     "id": "9c1f..", "prompt_tokens": 8192, "completion_tokens": 17, "cached_tokens": 4096,
     "cached_tokens_details": {"device": 2048, "host": 1024, "storage": 1024, "storage_backend": "..."},
     "queue_time": 0.012, "request_received_ts": 1764579600.5, "first_token_latency": 0.21, ...}

one JSON object a line, appended in finish order. Its quirks are the named constants below,
each with the SGLang function that makes it so.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

import msgspec

from tierdiag.trace.lines import BadLine
from tierdiag.trace.reader import MAX_ARRIVAL_NS, MAX_LENGTH_TOKENS
from tierdiag.units import NS_PER_S
from tierdiag.trace.fields import json_type as _json_type  # one wording for "got <type>" in trace and import errors


# --- the format's quirks, written once ------------------------------------------------------

# FileRequestMetricsExporter._ensure_file_handler (srt/observability/request_metrics_exporter.py):
# one file per hour, named by `datetime.now().strftime("%Y%m%d_%H")` when the record is
# written, i.e. when the request finished; lines within a file are in finish order, not
# arrival order. Rotated copies may be gzipped by the operator.
EXPORT_FILE_RE = re.compile(r"^sglang-request-metrics-(\d{8}_\d{2})\.log(\.gz)?$")
EXPORT_GLOBS = ("sglang-request-metrics-*.log", "sglang-request-metrics-*.log.gz")

# RequestMetricsExporter._format_output_data: `"request_parameters": json.dumps(request_params)`
# -- the normalised GenerateReqInput as a JSON *string* inside the JSON line (decode twice);
# its None-valued fields are left out. The response's meta_info keys sit beside it at top level.
REQUEST_PARAMETERS_KEY = "request_parameters"
# Keys every exported generate request has (TokenizerManager._handle_batch_output builds
# meta_info with "id", "prompt_tokens", ...): how a line is recognised as an SGLang export.
SIGNATURE_KEYS = ("request_parameters", "id", "prompt_tokens")

# OutputStreamer.get_cached_tokens_details (srt/managers/scheduler_components/output_streamer.py):
# None when nothing was cached (the key is present, its value null: a miss); {"device", "host"}
# otherwise, plus "storage" (and "storage_backend") when HiCache has an L3 backend. Storage
# tokens travel storage -> host -> device but are counted only under "storage"
# (schedule_batch.split_cached_prefix_by_tier), so device + host + storage == cached_tokens.
DETAILS_KEY = "cached_tokens_details"

# Units are mixed. ReqTimeStats.convert_to_output_meta_info / SchedulerReqTimeStats.
# convert_to_output_meta_info (srt/observability/req_time_stats.py):
# * epoch seconds (convert_time_to_realtime of a perf_counter stamp):
EPOCH_S_KEYS = ("request_received_ts", "forward_entry_time", "prefill_finished_time",
                "request_finished_ts", "response_sent_to_client_ts")
# * durations in seconds: queue_time = SchedulerReqTimeStats.queue_duration_s (summed over
#   every wait, a retracted request waits again); first_token_latency = first_token_time -
#   created_time, present only when first_token_time > created_time; storage_prefetch_wait
#   present only when a prefetch was timed (HiCache storage).
DURATION_S_KEYS = ("queue_time", "e2e_latency", "first_token_latency", "storage_prefetch_wait")
# TokenizerManager._handle_batch_output: `meta_info["dp_rank"] = recv_obj.dp_ranks[i]` whenever the
# batch carries dp_ranks, which OutputStreamer's accumulator fills with the scheduler's own
# `get_parallel().dp_rank` (scheduler_components/output_streamer.py, to_payload): the data-parallel
# rank that served the request, or null where there is no data-parallel controller
# (SpawnRanks.dp_rank None). Exports from before 0.5.23 have no such key.
DP_RANK_KEY = "dp_rank"
MAX_DP_RANK = 2**31 - 1  # the store's INTEGER column
# Every timing key except e2e_latency needs the server's --enable-metrics
# (TokenizerManager._handle_batch_output adds them under `if self.enable_metrics`).
METRICS_FLAG = "--enable-metrics"

# TokenizerManager._tokenize_one_request tokenizes `text` into a local list and never writes it
# back to obj.input_ids, so a request sent as text is exported as text only. And with
# --log-requests at --log-requests-level 0 or 1, RequestLogger._compute_metadata puts
# "input_ids" and "text" in obj_skip_names, which the exporter drops from request_parameters.
KEEP_TOKEN_IDS_HINT = (
    "to make SGLang export token ids, send prompts as token ids (\"input_ids\" on /generate, a "
    "token list as the /v1/completions prompt; /v1/chat/completions exports input_ids for text-only "
    "chats) or launch it with --skip-tokenizer-init, and do not combine --log-requests with "
    "--log-requests-level 0 or 1 (those levels drop input_ids from the export)")

# Python's json.dump (the exporter's writer) emits NaN/Infinity for non-finite floats; strict
# parsers refuse them, so a line that fails the fast parser is retried with the stdlib one.
_FINISHED_TYPES = ("stop", "length")  # FINISH_MATCHED_* / FINISH_LENGTH .to_json()["type"]



# --- typed records ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SGLangRequest:
    """One exported request. None means the server did not report it (never 0 for unknown)."""

    req_id: str
    file: str
    line: int
    prompt_tokens: int
    completion_tokens: int | None
    cached_tokens: int | None
    # The tier split; all three None when the export has no cached_tokens_details at all, all
    # three 0 when it is null (a miss).
    device_tokens: int | None
    host_tokens: int | None
    storage_tokens: int | None
    storage_backend: str | None
    received_s: float | None  # epoch seconds
    forward_entry_s: float | None
    prefill_finished_s: float | None
    finished_s: float | None
    queue_s: float | None
    e2e_s: float | None
    ttft_s: float | None  # first_token_latency
    storage_prefetch_wait_s: float | None
    num_retractions: int | None
    finish_type: str | None  # stop | length | abort | ...
    finish_message: str | None
    dp_rank: int | None = None  # the data-parallel rank that served it (DP_RANK_KEY; None: not exported)
    # From request_parameters; decoded only when asked (`with_tokens`). input_ids is the JSON
    # text of the array (b"[1, 2, ...]"), checked to hold prompt_tokens non-negative integers.
    input_ids: bytes | None = None
    has_text: bool = False
    stream: bool | None = None

    @property
    def finished(self) -> bool:
        return self.finish_type in _FINISHED_TYPES

    @property
    def reused_tokens(self) -> int | None:
        if self.device_tokens is None:
            return self.cached_tokens
        return self.device_tokens + self.host_tokens + self.storage_tokens  # type: ignore[operator]


@dataclass
class ImportReport:
    """What reading found besides the records; filled while iterating."""

    files: list[str] = field(default_factory=list)
    num_records: int = 0
    bad_lines: int = 0
    first_bad: list[str] = field(default_factory=list)  # "file:line: message", first few
    details_mismatch: int = 0  # cached_tokens != device + host + storage (split kept)
    first_mismatch: str | None = None
    bytes_read: int = 0
    incomplete_tails: list[str] = field(default_factory=list)  # "file:line" of a cut-short last line


# --- decoding --------------------------------------------------------------------------------


class _Details(msgspec.Struct):
    device: int = 0
    host: int = 0
    storage: int = 0
    storage_backend: str | None = None


class _Record(msgspec.Struct):
    """The top-level keys we use; the rest are skipped by the decoder without being built."""

    request_parameters: msgspec.Raw = msgspec.Raw(b"")
    id: str | msgspec.UnsetType = msgspec.UNSET
    prompt_tokens: int | msgspec.UnsetType = msgspec.UNSET
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cached_tokens_details: _Details | None | msgspec.UnsetType = msgspec.UNSET
    num_retractions: int | None = None
    finish_reason: dict | None = None
    request_received_ts: float | None = None
    forward_entry_time: float | None = None
    prefill_finished_time: float | None = None
    request_finished_ts: float | None = None
    queue_time: float | None = None
    e2e_latency: float | None = None
    first_token_latency: float | None = None
    storage_prefetch_wait: float | None = None
    dp_rank: int | None = None


class _Params(msgspec.Struct):
    # Raw: the array's JSON text, checked and copied as it is. Building 8k Python ints a request
    # to write them back out cost 3x the whole plain import (benchmarks/import_sglang.py).
    input_ids: msgspec.Raw = msgspec.Raw(b"")
    text: msgspec.Raw = msgspec.Raw(b"")
    stream: bool | None = None


_NULL = b"null"
_ID_DIGITS_AND_BLANKS = b"0123456789 \t\n\r"


_record_decoder = msgspec.json.Decoder(_Record)
_params_decoder = msgspec.json.Decoder(_Params)
_str_decoder = msgspec.json.Decoder(str)


# One full parse a line, whatever its key order or layout: a faster path that hopped over the
# (long) request_parameters string without parsing it accepted lines the parse refuses (a raw
# control byte or an invalid escape in that string), so which of two lines was accepted depended
# on where its keys happened to sit. msgspec skips a Raw string at a few GB/s, checking it.
_DECODE_ERRORS = (msgspec.ValidationError, msgspec.DecodeError, RecursionError)
_TOO_DEEP = "nested too deeply"


def decode_record(data: bytes) -> _Record:
    try:
        return _record_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise BadLine(_validation_message(exc)) from None
    except RecursionError:  # msgspec raises it past its depth limit (a line nested 100k deep)
        raise BadLine(f"bad JSON ({_TOO_DEEP})") from None
    except msgspec.DecodeError as exc:
        # NaN / Infinity (Python's json.dump writes them): the stdlib parser reads them, then
        # the same typed conversion checks the result.
        try:
            obj = json.loads(data)
        except RecursionError:
            raise BadLine(f"bad JSON ({_TOO_DEEP})") from None
        except ValueError:
            raise BadLine(f"bad JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise BadLine(f"expected a JSON object, got {_json_type(obj)}") from None
        params = obj.pop(REQUEST_PARAMETERS_KEY, None)
        try:
            rec = msgspec.convert(obj, _Record)
        except msgspec.ValidationError as exc2:
            raise BadLine(_validation_message(exc2)) from None
        except RecursionError:
            raise BadLine(f"bad JSON ({_TOO_DEEP})") from None
        if params is not None:
            try:
                rec.request_parameters = msgspec.Raw(msgspec.json.encode(params))
            except (msgspec.EncodeError, UnicodeEncodeError, RecursionError) as exc3:
                raise BadLine(f"'{REQUEST_PARAMETERS_KEY}' cannot be read ({exc3})") from None
        return rec


def _validation_message(exc: msgspec.ValidationError) -> str:
    text = str(exc)
    if text.startswith("Expected `object`"):
        return "expected a JSON object, " + text.split(",", 1)[1].strip() if "," in text else text
    # msgspec: "Expected `int`, got `str` - at `$.prompt_tokens`"
    return text.replace("$.", "")




# Bounds, so that every number read fits the store's int64 columns with what is added to it:
# epoch times and durations are each below 2**62 ns (~146 years), so arrival + TTFT never
# passes int64 (the trace reader's MAX_ARRIVAL_NS); token counts are lengths, bounded as a
# trace's are (MAX_LENGTH_TOKENS, past every model's context), so `--trace-out` replays.
MAX_SECONDS = MAX_ARRIVAL_NS / NS_PER_S
MAX_TOKENS = MAX_LENGTH_TOKENS
MAX_RETRACTIONS = 2**31 - 1


def _nonneg(name: str, value: float | None, *, epoch: bool = False) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value) or value < 0:
        raise BadLine(f"'{name}' is {value!r}, expected a finite number of seconds >= 0")
    if value >= MAX_SECONDS:
        what = "a time after the year 2116" if epoch else f"a duration of more than {MAX_SECONDS:.3g} s"
        raise BadLine(f"'{name}' is {value!r}: {what}, past what tierdiag can hold in int64 ns")
    return value


def _count(name: str, value: int | None, limit: int = MAX_TOKENS) -> int | None:
    if value is None:
        return None
    if value < 0:
        raise BadLine(f"'{name}' is negative ({value})")
    if value > limit:
        raise BadLine(f"'{name}' is {value:,}, more than {limit:,}")
    return value


def _text(name: str, value: str | None) -> str | None:
    """A string as the store can hold it: JSON's \\ud800 escapes decode to lone surrogates, which
    no UTF-8 text (the store, a trace) can carry."""
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = value[exc.start:exc.end].encode("utf-8", "backslashreplace").decode("ascii")
            raise BadLine(f"'{name}' holds {bad}, a lone surrogate (not valid Unicode)") from None
    return value


def to_request(rec: _Record, file: str, lineno: int, with_tokens: bool, report: ImportReport) -> SGLangRequest:
    if rec.id is msgspec.UNSET or rec.prompt_tokens is msgspec.UNSET or not rec.request_parameters:
        missing = [k for k, v in (("request_parameters", rec.request_parameters or None), ("id", rec.id),
                                  ("prompt_tokens", rec.prompt_tokens)) if v in (None, msgspec.UNSET)]
        raise BadLine(f"missing {', '.join(repr(k) for k in missing)} (not an SGLang request-metrics record)")
    req_id = _text("id", rec.id)
    if not req_id.strip():
        raise BadLine("'id' is empty")
    prompt = _count("prompt_tokens", rec.prompt_tokens)
    cached = _count("cached_tokens", rec.cached_tokens)
    if cached is not None and cached > prompt:
        raise BadLine(f"'cached_tokens' {cached} exceeds 'prompt_tokens' {prompt}")
    d = rec.cached_tokens_details
    backend = None
    if d is msgspec.UNSET:
        device = host = storage = None
    elif d is None:  # OutputStreamer.get_cached_tokens_details: nothing cached
        device = host = storage = 0
    else:
        device, host, storage = (_count(f"{DETAILS_KEY}.{k}", getattr(d, k)) for k in ("device", "host", "storage"))
        backend = _text(f"{DETAILS_KEY}.storage_backend", d.storage_backend)
        total = device + host + storage
        if total > prompt:
            raise BadLine(f"'{DETAILS_KEY}' adds up to {total} tokens, more than 'prompt_tokens' {prompt}")
        if cached is not None and total != cached:
            report.details_mismatch += 1
            if report.first_mismatch is None:
                report.first_mismatch = (f"{file}:{lineno}: cached_tokens {cached} but {DETAILS_KEY} "
                                         f"adds up to {total}")
    if d is None and cached:
        raise BadLine(f"'{DETAILS_KEY}' is null (a miss) but 'cached_tokens' is {cached}")
    fr = rec.finish_reason
    finish_type = finish_message = None
    if isinstance(fr, dict):
        t, m = fr.get("type"), fr.get("message")
        finish_type = _text("finish_reason.type", t) if isinstance(t, str) else None
        finish_message = _text("finish_reason.message", m) if isinstance(m, str) else None
    input_ids = None
    has_text = False
    stream = None
    if with_tokens:
        input_ids, has_text, stream = _params(rec.request_parameters, prompt)
    return SGLangRequest(
        req_id=req_id, file=file, line=lineno, prompt_tokens=prompt,
        completion_tokens=_count("completion_tokens", rec.completion_tokens), cached_tokens=cached,
        device_tokens=device, host_tokens=host, storage_tokens=storage, storage_backend=backend,
        received_s=_nonneg("request_received_ts", rec.request_received_ts, epoch=True),
        forward_entry_s=_nonneg("forward_entry_time", rec.forward_entry_time, epoch=True),
        prefill_finished_s=_nonneg("prefill_finished_time", rec.prefill_finished_time, epoch=True),
        finished_s=_nonneg("request_finished_ts", rec.request_finished_ts, epoch=True),
        queue_s=_nonneg("queue_time", rec.queue_time), e2e_s=_nonneg("e2e_latency", rec.e2e_latency),
        ttft_s=_nonneg("first_token_latency", rec.first_token_latency),
        storage_prefetch_wait_s=_nonneg("storage_prefetch_wait", rec.storage_prefetch_wait),
        num_retractions=_count("num_retractions", rec.num_retractions, MAX_RETRACTIONS),
        finish_type=finish_type, finish_message=finish_message,
        dp_rank=_count(DP_RANK_KEY, rec.dp_rank, MAX_DP_RANK),
        input_ids=input_ids, has_text=has_text, stream=stream)


def _params(raw: msgspec.Raw, prompt_tokens: int) -> tuple[bytes | None, bool, bool | None]:
    """Decode request_parameters: a JSON string holding JSON (REQUEST_PARAMETERS_KEY).

    Returns (input_ids as the JSON text of a flat integer array, or None; has text; stream).
    Always both parses, the string and the JSON inside it: a search for the input_ids key in
    the escaped text would accept a request whose JSON the parse refuses (an invalid escape, a
    raw control character), depending on where its keys sit. input_ids stay Raw (their text,
    checked by `_checked_ids`): building 8k Python ints a request to write them back out cost
    3x the whole plain import (benchmarks/import_sglang.py)."""
    try:
        inner = _str_decoder.decode(raw)
    except msgspec.ValidationError:
        raise BadLine(f"'{REQUEST_PARAMETERS_KEY}' must be a string holding JSON "
                       f"(SGLang writes json.dumps of the request)") from None
    except msgspec.DecodeError as exc:
        raise BadLine(f"'{REQUEST_PARAMETERS_KEY}' is not a valid JSON string ({exc})") from None
    try:
        p = _params_decoder.decode(inner)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadLine(f"'{REQUEST_PARAMETERS_KEY}' does not hold a request: {str(exc).replace('$.', '')}") from None
    except RecursionError:
        raise BadLine(f"'{REQUEST_PARAMETERS_KEY}' does not hold a request: {_TOO_DEEP}") from None
    has_text = bool(p.text) and bytes(p.text) != _NULL
    ids = bytes(p.input_ids) if p.input_ids else None
    if ids is None or ids == _NULL:
        return None, has_text, p.stream
    return _checked_ids(ids, prompt_tokens), has_text, p.stream


def _checked_ids(ids: bytes, prompt_tokens: int) -> bytes:
    """`ids`, valid JSON text, if it is a flat list of `prompt_tokens` non-negative integers."""
    # Valid JSON holding only digits, commas and blanks between its brackets is a flat list of
    # non-negative integers: what is left without digits and blanks must be "[" + commas + "]".
    rest = ids.translate(None, _ID_DIGITS_AND_BLANKS)
    if rest[:1] != b"[" or rest[-1:] != b"]" or rest[1:-1].strip(b","):
        raise BadLine(f"'{REQUEST_PARAMETERS_KEY}' input_ids must be a flat list of non-negative integers")
    n = len(rest) - 1 if ids[1:-1].strip() else 0  # "[]" holds none; "[7]" leaves "[]" too
    if n != prompt_tokens:
        raise BadLine(f"'{REQUEST_PARAMETERS_KEY}' has {n} input_ids but 'prompt_tokens' is {prompt_tokens}")
    return ids
