"""The hash-id chain a trace's lines must keep (trace/reader.py's `_parse` checks each line's
`hash_ids` here): two requests that share hash id k share every block up to k, so an id seen
behind two different predecessors is a bad line.

`link_chain` is the check `_parse` calls: on the compiled data plane one C loop over the line's
ids against `ChainLinks`' array (native/csrc/trace_chain.c), taking the Python reference
(`_link_chain_python`) for whatever it leaves (an id outside the array, a broken chain: the
reference grows the array, asks the dict, or words the error); on the numpy data plane the
reference alone. Both keep the same links and raise the same message (tests/trace).
"""

from __future__ import annotations

from array import array
from operator import itemgetter

from tierdiag.native import cplane
from tierdiag.trace.lines import BadLine


class ChainLinks:
    """hash id -> the id before it (-1: a first block), as `_parse` keeps it for the whole trace.

    Ids are small, dense integers in every trace seen (Mooncake's and `synth`'s count up from 0),
    so they index an int64 array (8 bytes an id, -2 where none is known); an id far past the ids
    held (a trace of hashes, a hostile id near 2**63) goes to a dict instead. A dict of every id
    held ~90 bytes an id, its int objects included: ~250 MB of a 1M-request `synth` replay's
    peak (2.8M distinct ids; issue 41's <= 1 GB), where the array holds 22 MB."""

    NONE = -2  # in the array: no link known
    DENSE_SLACK = 1 << 20  # the array may run this far past twice the ids it holds

    __slots__ = ("_dense", "_sparse", "_count")

    def __init__(self) -> None:
        self._dense = array("q")
        self._sparse: dict[int, int] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def get(self, h: int) -> int | None:
        if 0 <= h < len(self._dense):
            known = self._dense[h]
            return None if known == self.NONE else known
        return self._sparse.get(h)

    def knowns(self, hash_ids: tuple[int, ...]) -> tuple:
        """Each id's predecessor (NONE where none is known), read at C speed where the ids are
        dense (the array grown to hold them), else one look-up an id."""
        top, dense = max(hash_ids), self._dense
        if top >= len(dense) and top < 2 * self._count + self.DENSE_SLACK:
            self._grow(top + 1)
        if top < len(dense) and min(hash_ids) >= 0:
            found = itemgetter(*hash_ids)(dense)
            return found if len(hash_ids) > 1 else (found,)
        return tuple(self.NONE if k is None else k for k in map(self.get, hash_ids))

    def _grow(self, size: int) -> None:
        """The array to at least `size` ids (doubling); ids the dict held that it now covers move in."""
        dense = self._dense
        size = max(size, 2 * len(dense))
        dense.extend(array("q", [self.NONE]) * (size - len(dense)))
        for h in [h for h in self._sparse if 0 <= h < size]:
            dense[h] = self._sparse.pop(h)

    def add(self, hash_ids, prevs) -> None:
        """Link each id (none held yet) to its predecessor."""
        dense, n, sparse = self._dense, len(self._dense), self._sparse
        for h, p in zip(hash_ids, prevs):
            if 0 <= h < n:
                dense[h] = p
            else:
                sparse[h] = p
            self._count += 1

    def add_run(self, first: int, count: int, prev: int) -> None:
        """Link the ids first .. first+count-1 (none held yet), each to the id before it and the
        first to `prev`: a line's new ids as a chained trace writes them (Mooncake's and
        `synth`'s count up), stored by one slice of the array rather than an id at a time."""
        dense, end = self._dense, first + count
        if 0 <= first and end <= len(dense):
            dense[first] = prev
            if count > 1:
                dense[first + 1:end] = array("q", range(first, end - 1))
            self._count += count
        else:
            self.add(range(first, end), (prev, *range(first, end - 1)))

    def as_dict(self) -> dict[int, int]:
        out = {h: p for h, p in enumerate(self._dense) if p != self.NONE}
        out.update(self._sparse)
        return out


def _link_chain_python(hash_ids: tuple[int, ...], parents: ChainLinks) -> None:
    """Add this line's links to `parents`; raise, adding none, if an id follows a different
    predecessor than before (or than earlier in the line).

    A chained trace's line is ids seen before (a shared prefix) then ids never seen, each once:
    that shape is checked with C-level tuple compares and one `parents` look-up an id, and its
    new ids go straight in. Anything else (a broken chain, an id twice in the line) takes
    `_check_chain_slow`, which finds the same links or the first bad position. The ids are >= 0
    (the line model bounds them; a negative one would index the array from its end)."""
    none = ChainLinks.NONE
    if len(hash_ids) > 1:
        # The ids are >= 0 (the line model's bound): where all are inside the array, one
        # itemgetter reads every link (an id past it raises, and ChainLinks.knowns grows the
        # array or asks its dict), without knowns' min() and max() a line.
        try:
            knowns = itemgetter(*hash_ids)(parents._dense)
        except IndexError:
            knowns = parents.knowns(hash_ids)
    else:
        knowns = parents.knowns(hash_ids)
    prevs = (-1, *hash_ids[:-1])
    if knowns == prevs:
        return
    if none in knowns:
        i = knowns.index(none)
        num_new = len(knowns) - i
        if knowns.count(none) == num_new and knowns[:i] == prevs[:i]:
            first = hash_ids[i]
            if hash_ids[-1] == first + num_new - 1 and hash_ids[i:] == tuple(range(first, first + num_new)):
                parents.add_run(first, num_new, prevs[i])  # new ids counting up: distinct, one slice
                return
            if len(set(hash_ids[i:])) == num_new:
                parents.add(hash_ids[i:], prevs[i:])
                return
    new = _check_chain_slow(hash_ids, parents)
    parents.add(new.keys(), new.values())


def _check_chain_slow(hash_ids: tuple[int, ...], parents) -> dict[int, int]:
    """The links this line adds to `parents` (a ChainLinks, or a dict); raises if an id follows
    a different predecessor."""
    new: dict[int, int] = {}
    prev = -1
    for pos, h in enumerate(hash_ids):
        known = parents.get(h)
        if known is None:
            known = new.setdefault(h, prev)
        if known != prev:
            before = "nothing" if known < 0 else f"id {known}"
            here = "nothing" if prev < 0 else f"id {prev}"
            raise BadLine(f"'hash_ids' do not chain: id {h} at position {pos} follows {here} here but "
                           f"{before} before (a shared hash id must mean a shared prefix)")
        prev = h
    return new


_c_link_chain = cplane.compiled("link_chain")


def _link_chain_c(hash_ids: tuple[int, ...], parents: ChainLinks) -> None:
    """`_link_chain_python` in one C call where every id lies inside the array (the usual line:
    ~0.2 us against ~3.4 us a line of a 200k `synth` trace); the reference for anything else."""
    added = _c_link_chain(parents._dense, hash_ids)
    if added >= 0:
        parents._count += added
    else:
        _link_chain_python(hash_ids, parents)


link_chain = cplane.choose("reader.link_chain", _link_chain_c, _link_chain_python)
