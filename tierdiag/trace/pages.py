"""Page keys: the identity of each full page of a request's input, chained through its prefix.

The radix tree is keyed by these ints, and the storage tier by `storage_key_chain` of them. A
key stands for the whole prefix up to and including its page, so two requests share key k only
if they share every page up to it. Only FULL pages get keys (`input_len // page_size`): a
trailing partial page is always computed, as in SGLang.

From Mooncake `hash_ids` (blocks of `block_size` tokens, already chained by the trace), page j of
block b is `hash_ids[b] * r + j` with r = block_size // page_size pages a block:

    tokens   |<------- block 0 (hash 7) ------->|<------- block 1 (hash 9) ------->|<- part ->
    pages    | 7r+0 | 7r+1 | ...       | 7r+r-1 | 9r+0 | ...               | 9r+r-1 | 11r+0 |...

From `tokens`, each key is a blake2b-64 of (previous page's digest ‖ this page's token ids as
4-byte little-endian words), folded to 63 bits so keys stay non-negative int64s.
"""

from __future__ import annotations

import hashlib
import sys
from array import array

from tierdiag.errors import ConfigError
from tierdiag.trace.reader import TraceRequest

_TOKEN_BYTES = 4
_WORD = "I"  # unsigned int: 4 bytes on every platform CPython supports that we run on
assert array(_WORD).itemsize == _TOKEN_BYTES, "page keys need 4-byte token words"


def page_keys(req: TraceRequest, *, page_size: int, block_size: int) -> list[int]:
    """One non-negative int key per full page of `req`'s input, chained through the prefix."""
    if page_size < 1:
        raise ConfigError(f"page size must be a positive number of tokens, got {page_size}")
    num_pages = req.input_len // page_size
    if req.hash_ids is not None:
        return _keys_from_hash_ids(req.hash_ids, num_pages, page_size=page_size, block_size=block_size)
    if req.tokens is not None:
        return _keys_from_tokens(req.tokens, num_pages, page_size=page_size)
    raise ValueError(f"request {req.req_id!r} has neither hash_ids nor tokens (the reader guarantees one)")


def _keys_from_hash_ids(hash_ids: tuple[int, ...], num_pages: int, *, page_size: int, block_size: int) -> list[int]:
    if block_size % page_size:
        raise ConfigError(f"block size {block_size} is not a multiple of page size {page_size}",
                          hint="hash_ids traces need --page-size to divide --block-size")
    per_block = block_size // page_size
    if per_block == 1:
        return list(hash_ids[:num_pages])
    num_blocks = -(-num_pages // per_block)
    offsets = range(per_block)
    # One comprehension over (block, offset) pairs: ~2.3M pages for the conversation trace.
    keys = [h * per_block + j for h in hash_ids[:num_blocks] for j in offsets]
    del keys[num_pages:]  # the last block may hold only part of a page run
    return keys


def _keys_from_tokens(tokens: tuple[int, ...], num_pages: int, *, page_size: int) -> list[int]:
    words = array(_WORD, tokens[: num_pages * page_size])
    if sys.byteorder != "little":  # pragma: no cover - keys must not depend on the host
        words.byteswap()
    data = words.tobytes()
    step = page_size * _TOKEN_BYTES
    blake2b = hashlib.blake2b
    from_bytes = int.from_bytes
    keys = []
    digest = b""
    for start in range(0, num_pages * step, step):
        digest = blake2b(digest + data[start:start + step], digest_size=8).digest()
        keys.append(from_bytes(digest, "little") >> 1)
    return keys


def storage_key_chain(keys: list[int]) -> list[str]:
    """Chained SHA-256 hex per page: sha256(previous hex ‖ key as 8 little-endian bytes).

    The storage tier names page files by these, so a file found on disk vouches for its whole
    prefix, not just its own page.
    """
    out = []
    prev = b""
    sha256 = hashlib.sha256
    for key in keys:
        prev = sha256(prev + key.to_bytes(8, "little")).hexdigest().encode("ascii")
        out.append(prev.decode("ascii"))
    return out
