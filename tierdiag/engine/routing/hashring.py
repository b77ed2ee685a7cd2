"""A consistent hash ring over ranks, shared by `session` and `prefix_hash`.

Each rank owns `VNODES` points on a 64-bit ring; a key goes to the owner of the first point at or
after its hash (wrapping). With virtual nodes the ranks' shares stay within a few per cent of
1/N, and the mapping is the same in every process (blake2b, not Python's salted hash), so a
replay is deterministic without a seed. The gateway's `consistent_hashing` and `prefix_hash`
policies look keys up on such a ring of workers (SelectWorkerInfo.hash_ring).
"""

from __future__ import annotations

from bisect import bisect_left

from tierdiag.engine.routing.base import stable_hash

VNODES = 160  # points a rank; more points, smoother shares, slower build (built once a run)


class HashRing:
    def __init__(self, num_ranks: int) -> None:
        points = sorted((stable_hash(f"rank-{r}#{v}".encode()), r) for r in range(num_ranks) for v in range(VNODES))
        self._hashes = [h for h, _ in points]
        self._owners = [r for _, r in points]

    def rank_of(self, key_hash: int) -> int:
        i = bisect_left(self._hashes, key_hash)
        return self._owners[i if i < len(self._hashes) else 0]
