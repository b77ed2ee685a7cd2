# h46writes: in the writer process only, pickle what it takes and when it writes.
import os, sys
_OUT = os.environ.get("H46_CAPTURE")
if _OUT and sys.argv[:1] == ["-c"]:
    import pickle, time
    import tierdiag.store.writer_serve as ws
    _log = []
    _orig_open, _orig_rows, _orig_write, _orig_finish = ws._Serve.open, ws._Serve.rows, ws._Serve.write, ws._Serve.finish
    _orig_take = None
    def open_(self, arg):
        _log.append(("open", dict(arg)))
        ok = _orig_open(self, arg)
        w = self.writer
        if w is not None:
            t = w.take
            def take(tables):
                out = t(tables)
                _log.append(("take", out))
                return out
            w.take = take
        return ok
    def write(self):
        # the vacuum decision as write would make it
        most = max(self.rows_taken.values(), default=0)
        vac = ws.vacuum_due(self.writes_since_vacuum + 1, max(self.rows_since_vacuum.values(), default=0), most)
        _log.append(("write", {"vacuum": vac, "t": time.monotonic()}))
        return _orig_write(self)
    def finish(self, arg):
        _log.append(("finish", dict(arg)))
        try:
            return _orig_finish(self, arg)
        finally:
            with open(_OUT, "wb") as fh:
                pickle.dump(_log, fh, protocol=5)
    ws._Serve.open, ws._Serve.write, ws._Serve.finish = open_, write, finish
