"""The token ids SGLang's side of the scheduler harness reads for a request (no SGLang import:
the worker and the tests share it).

Token j of block b is 1 + hash_ids[b] * block + j: two requests share a token prefix exactly where
they share (prefix-chained) hash ids, block by block, so SGLang's radix tree, matching tokens,
shares what the engine's tree, matching the page keys of the same hash ids (trace/pages.py:
hash * pages-a-block + page), shares. A request given as `tokens` (a tierdiag JSONL trace driven by
tests/sglang/drive.py) is read as it is. Every id stays below OUTPUT_TOKEN_BASE, where the stand-in
model's fresh output ids start.
"""

from __future__ import annotations

OUTPUT_TOKEN_BASE = 1 << 30


def input_tokens(r: dict, block: int) -> list[int]:
    n = r["input_len"]
    if r.get("tokens") is not None:  # a trace of token ids (tests/sglang/drive.py renumbers them below the base)
        out = list(r["tokens"])
        if len(out) != n or (out and (min(out) < 0 or max(out) >= OUTPUT_TOKEN_BASE)):
            raise ValueError(f"request {r.get('id')}: {len(out)} tokens for {n} input tokens, or an id outside "
                             f"[0, {OUTPUT_TOKEN_BASE})")
        return out
    out: list[int] = []
    for b, h in enumerate(r["hash_ids"]):
        if len(out) >= n:
            break
        base = 1 + h * block
        out.extend(range(base, base + min(block, n - b * block)))
    if len(out) != n:
        raise ValueError(f"request {r.get('id')}: {len(r['hash_ids'])} hash ids of {block} tokens do not cover "
                         f"{n} input tokens")
    used = r["hash_ids"][: -(-n // block)]
    if n and (min(used) < 0 or 1 + max(used) * block + block > OUTPUT_TOKEN_BASE):
        raise ValueError(f"request {r.get('id')}: a hash id outside [0, {OUTPUT_TOKEN_BASE // block}) "
                         f"for {block}-token blocks")
    return out
