"""Write SGLang 0.5.23 request-metrics export lines the way SGLang does, for the importer tests.

Mirrors RequestMetricsExporter._format_output_data and FileRequestMetricsExporter.write_record
(srt/observability/request_metrics_exporter.py): `json.dump({"request_parameters":
json.dumps(params), **meta_info})` + "\\n", meta_info keys in the order
TokenizerManager._handle_batch_output adds them (timing keys only with --enable-metrics).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

EPOCH = 1_764_579_600.0  # 2025-12-01 09:00:00 UTC, the server's clock


def record(rid: str, *, prompt: int, completion: int = 8, device: int = 0, host: int = 0,
           storage: int | None = None, backend: str | None = None, arrival_s: float | None = 0.0,
           queue_s: float = 0.001, ttft_s: float | None = 0.05, e2e_s: float = 0.2,
           tokens: list[int] | None = None, text: str | None = None, stream: bool = False,
           metrics: bool = True, finish: dict | None = None, prefetch_wait_s: float | None = None,
           details: object = "auto", cached: int | None = None, dp_rank: object = "absent") -> dict:
    """One exported request. `arrival_s` is seconds after EPOCH; None drops the timing keys.
    `dp_rank`: the serving rank as 0.5.23 exports it (an int, or None: no data-parallel
    controller); "absent" leaves the key out (an export from before it)."""
    params: dict = {}
    if text is not None:
        params["text"] = text
    if tokens is not None:
        params["input_ids"] = tokens
    params.update({"sampling_params": {"max_new_tokens": completion, "temperature": 0.0},
                   "rid": rid, "return_logprob": False, "stream": stream, "log_metrics": True})
    reused = device + host + (storage or 0)
    if details == "auto":
        if reused:
            details = {"device": device, "host": host}
            if storage is not None or backend is not None:
                details["storage"] = storage or 0
            if backend is not None:
                details["storage_backend"] = backend
        else:
            details = None  # get_cached_tokens_details: nothing cached
    meta: dict = {"id": rid, "finish_reason": finish or {"type": "length", "length": completion},
                  "prompt_tokens": prompt, "weight_version": "default", "num_retractions": 0}
    received = None if arrival_s is None else EPOCH + arrival_s
    if metrics and received is not None:
        if prefetch_wait_s is not None:
            meta["storage_prefetch_wait"] = prefetch_wait_s
        meta["forward_entry_time"] = received + queue_s + 0.0005
        meta["prefill_finished_time"] = received + (ttft_s or 0.01)
        meta["queue_time"] = queue_s
    meta.update({"reasoning_tokens": 0, "completion_tokens": completion,
                 "cached_tokens": reused if cached is None else cached})
    if details != "absent":
        meta["cached_tokens_details"] = details
    if dp_rank != "absent":  # TokenizerManager._handle_batch_output, after the batch's own fields
        meta["dp_rank"] = dp_rank
    meta["e2e_latency"] = e2e_s
    if metrics and received is not None:
        meta["request_received_ts"] = received
        if ttft_s is not None:
            meta["first_token_latency"] = ttft_s
        if stream:  # set when the first chunk went out (TokenizerManager._wait_one_response)
            meta["response_sent_to_client_ts"] = received + (ttft_s or 0.0) + 0.0001
        meta["request_finished_ts"] = received + e2e_s
        if completion > 1 and ttft_s is not None:
            meta["decode_throughput"] = (completion - 1) / (e2e_s - ttft_s)
    if not stream:  # non-streaming: set right before the final response is logged
        meta["response_sent_to_client_ts"] = (received or EPOCH) + e2e_s + 0.0001
    return {"request_parameters": json.dumps(params), **meta}


def write_export(folder: Path, hour: str, records: list[dict | str], *, gz: bool = False) -> Path:
    """Append records (dicts, or raw lines for malformed cases) to the file of `hour` (YYYYMMDD_HH)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"sglang-request-metrics-{hour}.log" + (".gz" if gz else "")
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)
    path = folder / name
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)
    return path
