"""A stand-in for RunWriter behind the writer process's serving loop (store/writer_serve.py
`_Serve`): the part `rows` and `write` use. `take` keeps the columns and counts the request rows,
each `write` records how many had been taken (`writes`); nothing is held (`hold_memory`)."""

from __future__ import annotations


class CountingWriter:
    def __init__(self):
        self.writes: list[int] = []  # request rows taken at each write
        self.taken = 0
        self._pending = False

    def take(self, tables):
        self._pending = True
        self.taken += len(next(iter(tables.get("requests", {"x": []}).values())))
        return tables

    def hold_memory(self, limit_bytes: int) -> bool:
        return False

    @property
    def pending(self):
        return self._pending

    def write(self, *, vacuum=True):
        self.writes.append(self.taken)
        self._pending = False
