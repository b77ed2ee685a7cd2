"""benchmarks/curves_threads.py's capture: with H46_CAPTURE=FILE and this folder on PYTHONPATH, the
writer process appends each batch of request columns it hands its read-ahead's live pass
(size_curves.py `_pass_columns` of `_ReadAhead.rows`) to FILE, pickled one after another. Nothing
is changed but that the batches are written down; without H46_CAPTURE nothing is imported."""
import os

if os.environ.get("H46_CAPTURE"):
    import pickle

    from tierdiag.diagnose.run import size_curves as _sc

    _hand = _sc._ReadAhead.rows
    _path = os.environ["H46_CAPTURE"]

    def _rows(self, taken):
        if taken is not None and taken.get("requests"):
            with open(_path, "ab") as f:
                pickle.dump(_sc._pass_columns(taken["requests"]), f)
        return _hand(self, taken)

    _sc._ReadAhead.rows = _rows
