"""Page keys: the identity of each full page of a request's input, chained through its prefix.

The radix tree and the storage tier are keyed by these ints. A key stands for the whole prefix
up to and including its page, so two requests share key k only if they share every page up to
it. Only FULL pages get keys (`input_len // page_size`): a
trailing partial page is always computed, as in SGLang.

From Mooncake `hash_ids` (blocks of `block_size` tokens, already chained by the trace), page j of
block b is `hash_ids[b] * r + j` with r = block_size // page_size pages a block:

    tokens   |<------- block 0 (hash 7) ------->|<------- block 1 (hash 9) ------->|<- part ->
    pages    | 7r+0 | 7r+1 | ...       | 7r+r-1 | 9r+0 | ...               | 9r+r-1 | 11r+0 |...

From `tokens`, each key is a blake2b-64 of (previous page's digest ‖ this page's token ids as
4-byte little-endian words), folded to 63 bits so keys stay non-negative int64s.

A request with an `extra_key` (SGLang's RadixKey.extra_key: LoRA id, cache salt) gets every key
XORed with a 63-bit digest of that string, so identical tokens under different keys never share a
page key, hence never a prefix (SGLang keys each tree child by (extra_key, tokens)). The XOR keeps
the chain: within one key space, key k still names the whole prefix up to its page.

Output pages (what decode adds, inserted at finish like SGLang's cache_finished_req) have no ids
in a trace. `output_page_keys` gives them synthetic keys: one blake2b digest of the request's last
input key and its id, stepped by an odd constant page by page (modulo 2**63), so they are
deterministic, distinct within a request, and as unlikely to meet another request's as random
63-bit keys; only a request carrying the same keys (none, in a trace) could match them. They are negative, so they can never equal an input key and
the engine's per-page bookkeeping (engine/pagemap.py) can tell them apart by sign: no request
ever computes them again, so there is nothing to remember about them.
"""

from __future__ import annotations

import sys
from array import array

import numpy as np

from tierdiag.errors import ConfigError
from tierdiag.native import cplane
from tierdiag.trace.reader import TraceRequest

_TOKEN_BYTES = 4
_WORD = "I"  # unsigned int: 4 bytes on every platform CPython supports that we run on
assert array(_WORD).itemsize == _TOKEN_BYTES, "page keys need 4-byte token words"


def page_keys(req: TraceRequest, *, page_size: int, block_size: int) -> list[int]:
    """One non-negative int key per full page of `req`'s input, chained through the prefix."""
    return page_keys_array(req, page_size=page_size, block_size=block_size).tolist()


def page_keys_array(req: TraceRequest, *, page_size: int, block_size: int) -> np.ndarray:
    """`page_keys` as an int64 array (the engine keeps both: lists for the tree, the array for
    its per-page bookkeeping)."""
    if page_size < 1:
        raise ConfigError(f"page size must be a positive number of tokens, got {page_size}")
    num_pages = req.input_len // page_size
    if req.hash_ids is not None:
        keys = _keys_from_hash_ids(req.hash_ids, num_pages, page_size=page_size, block_size=block_size)
    elif req.tokens is not None:
        keys = np.array(_keys_from_tokens(req.tokens, num_pages, page_size=page_size), dtype=np.int64)
    else:
        raise ValueError(f"request {req.req_id!r} has neither hash_ids nor tokens (the reader guarantees one)")
    if req.extra_key is not None:
        keys ^= extra_key_salt(req.extra_key)
    return keys


def extra_key_salt(extra_key: str) -> int:
    """A non-zero 63-bit digest of an extra_key string (XORed into every page key under it)."""
    import hashlib  # in the functions that hash in Python (none on the C data plane's paths): ~2 ms of OpenSSL

    digest = hashlib.blake2b(b"tierdiag-extra-key\0" + extra_key.encode("utf-8"), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 1) or 1


_OUTPUT_STEP = 0x9E3779B97F4A7C15 >> 1 | 1  # odd: j -> seed + j * step never repeats below 2**63
_MASK63 = (1 << 63) - 1


def output_page_keys(req_id: str, input_keys: list[int], num_pages: int) -> list[int]:
    """Synthetic keys for the `num_pages` pages after the input's full pages (the input's partial
    tail page and the output tokens): a blake2b-64 seed from the last input key and the request
    id, stepped by an odd constant modulo 2**63, so two requests never share them; negative
    (input keys never are). One digest a request, not one a page (~60k of them a trace)."""
    seed = _output_seed(req_id, input_keys[-1] if len(input_keys) else 0)
    if num_pages >= _NUMPY_OUTPUT_PAGES:
        return _output_keys_numpy(seed, num_pages)
    step = _OUTPUT_STEP
    return [-((seed + j * step) & _MASK63) - 1 for j in range(num_pages)]


def _output_seed(req_id: str, last: int) -> int:
    """output_page_keys' seed: a blake2b-64 of the last input key and the request id, 63 bits."""
    import hashlib

    digest = hashlib.blake2b(b"out" + int(last).to_bytes(8, "little", signed=True) + req_id.encode("utf-8"),
                             digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def extend_output_keys_numpy(req_id: str, keys: list[int], keys_np: np.ndarray, n_in: int,
                             n_total: int) -> np.ndarray:
    """A request's keys grown to `n_total` pages with its output pages' keys (`output_page_keys`
    of its id and last input key, keys[n_in - 1], past the `len(keys) - n_in` it has already):
    they are appended to the list `keys`, and `keys_np` with them appended is returned (a new
    array). The reference of `extend_output_keys_c` (tests/trace/test_trace_pages.py checks
    they agree)."""
    out = output_page_keys(req_id, keys[n_in - 1:n_in], n_total - n_in)[len(keys) - n_in:]
    keys.extend(out)
    return np.concatenate((keys_np, np.array(out, dtype=np.int64)))


def _seed_c(req_id: str, keys: list[int], n_in: int) -> int:
    """The output keys' seed (`_output_seed` of the last input key, keys[n_in - 1]) by the
    compiled blake2b (_cplane.output_seed: hashlib's object was most of a finish's cost), or
    by hashlib where it declines."""
    last = keys[n_in - 1] if n_in else 0
    seed = _c_output_seed(req_id, last)
    return _output_seed(req_id, last) if seed == -1 else seed


def extend_output_keys_c(req_id: str, keys: list[int], keys_np: np.ndarray, n_in: int,
                         n_total: int) -> np.ndarray:
    """`extend_output_keys_numpy` with the keys made, appended and laid after `keys_np` in one C
    call (_cplane.output_keys), the seed's blake2b too (_cplane.output_seed, RFC 7693): a finish
    with output pages made three generic calls (output_page_keys with hashlib's blake2b,
    np.array, np.concatenate), ~35k instructions a finish (callgrind, issue 41 session 19). What
    they decline, having changed nothing, takes the Python and numpy paths."""
    if 0 <= n_in <= len(keys):
        got = _c_output_keys(keys, keys_np, _seed_c(req_id, keys, n_in), len(keys) - n_in, n_total - n_in)
        if got != -1:
            return np.frombuffer(got, _INT64)
    return extend_output_keys_numpy(req_id, keys, keys_np, n_in, n_total)


def append_output_keys_py(req_id: str, keys: list[int], n_in: int, n_total: int) -> None:
    """`extend_output_keys_numpy`'s keys alone: the output pages' keys appended to `keys` (a list
    or a key run) up to `n_total` pages, and no array made. A finish's (DecodeSteps._finish): the
    request's `keys_np` is read by no one after it, and the whole-list array a finish made was a
    copy of every key and a large allocation a request (issue 41, session 24). The reference of
    the engine's `schedule_common.append_output_keys_c` (tests/engine/test_key_runs.py checks
    they agree)."""
    keys.extend(output_page_keys(req_id, keys[n_in - 1:n_in], n_total - n_in)[len(keys) - n_in:])


# From this many output pages numpy's fixed ~4 us beats ~0.13 us a page in Python (a trace's
# mean is ~5 pages; long generations run to hundreds).
_NUMPY_OUTPUT_PAGES = 32


def _output_keys_numpy(seed: int, num_pages: int) -> list[int]:
    # uint64 adds and multiplies wrap modulo 2**64; masking to 63 bits then leaves the value
    # modulo 2**63, as in the Python expression. As an int64 it is then non-negative, and
    # ~v = -v - 1.
    x = np.arange(num_pages, dtype=np.uint64)
    x *= np.uint64(_OUTPUT_STEP)
    x += np.uint64(seed)
    x &= np.uint64(_MASK63)
    return np.invert(x.view(np.int64)).tolist()


def _keys_from_hash_ids(hash_ids: tuple[int, ...], num_pages: int, *, page_size: int, block_size: int) -> np.ndarray:
    if block_size % page_size:
        raise ConfigError(f"block size {block_size} is not a multiple of page size {page_size}",
                          hint="hash_ids traces need --page-size to divide --block-size")
    return block_page_keys(hash_ids, num_pages, block_size // page_size)


def _block_page_keys_c(hash_ids: tuple[int, ...], num_pages: int, per_block: int) -> np.ndarray:
    """`_block_page_keys_numpy` in one C loop (_cplane.block_page_keys: ~3.5 % of Engine.run's
    instructions saved, benchmarks/README.md "Session 11"); what it declines (a key that would overflow,
    odd types) takes the numpy path, which raises what it raises."""
    out = _c_block_page_keys(hash_ids, num_pages, per_block)
    if out == -1:
        return _block_page_keys_numpy(hash_ids, num_pages, per_block)
    return np.frombuffer(out, _INT64)  # the bytearray's memory: writable, this call's own


def _block_page_keys_numpy(hash_ids: tuple[int, ...], num_pages: int, per_block: int) -> np.ndarray:
    """The first `num_pages` keys of blocks `hash_ids`, `per_block` pages each (the reference of
    `_block_page_keys_c`; tests/engine/test_cplane.py checks they agree)."""
    if per_block == 1:
        return np.array(hash_ids[:num_pages], dtype=np.int64)
    num_blocks = min(-(-num_pages // per_block), len(hash_ids))
    # page j of block b: hash_ids[b] * per_block + j (the reader bounds hash ids so this fits):
    # one outer sum, rows laid end to end. np.array of a tuple is cheaper than np.fromiter here.
    blocks = np.array(hash_ids[:num_blocks], dtype=np.int64)
    blocks *= per_block
    return np.add.outer(blocks, _page_offsets(per_block)).reshape(-1)[:num_pages]


_c_block_page_keys = cplane.compiled("block_page_keys")
# The dtype made once and passed by position: np.frombuffer's keyword parsing and dtype
# conversion were most of its cost, once a request (callgrind, issue 41)
_INT64 = np.dtype(np.int64)
# The backend native/cplane.py chose.
block_page_keys = cplane.choose("pages.block_page_keys", _block_page_keys_c, _block_page_keys_numpy)
_c_output_keys, _c_output_seed = cplane.compiled("output_keys"), cplane.compiled("output_seed")


def keys_list_numpy(keys_np: np.ndarray) -> list[int]:
    """A request's page keys as the list the tree keeps (`req.keys`): numpy's tolist. The
    compiled side (_cplane.keys_list, called by the engine with no Python frame between) makes
    the same ints in one C loop and hands anything but a 1-D int64 array to this same tolist."""
    return keys_np.tolist()


keys_list = cplane.choose("pages.keys_list", cplane.compiled("keys_list"), keys_list_numpy)
extend_output_keys = cplane.choose("pages.extend_output_keys", extend_output_keys_c, extend_output_keys_numpy)

_PAGE_OFFSETS: dict[int, np.ndarray] = {}


def _page_offsets(per_block: int) -> np.ndarray:
    """0 .. per_block-1 as int64, made once a page size (read-only: shared by every call)."""
    offsets = _PAGE_OFFSETS.get(per_block)
    if offsets is None:
        offsets = np.arange(per_block, dtype=np.int64)
        offsets.flags.writeable = False
        offsets = _PAGE_OFFSETS.setdefault(per_block, offsets)
    return offsets


def _keys_from_tokens(tokens: tuple[int, ...], num_pages: int, *, page_size: int) -> list[int]:
    words = array(_WORD, tokens[: num_pages * page_size])
    if sys.byteorder != "little":  # pragma: no cover - keys must not depend on the host
        words.byteswap()
    data = words.tobytes()
    step = page_size * _TOKEN_BYTES
    import hashlib

    blake2b = hashlib.blake2b
    from_bytes = int.from_bytes
    keys = []
    digest = b""
    for start in range(0, num_pages * step, step):
        digest = blake2b(digest + data[start:start + step], digest_size=8).digest()
        keys.append(from_bytes(digest, "little") >> 1)
    return keys
