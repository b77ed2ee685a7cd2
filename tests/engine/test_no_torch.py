"""A CPU replay never imports torch: its pools are numpy buffers (engine/pagepool.py), and their
torch view, made on demand, is the same memory."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.diagnose.test_cli import run_cli
from tierdiag.engine.hardware import cuda_device_present
from tierdiag.engine.content import verify_content, write_content
from tierdiag.engine.dataplane import DataPlane
from tierdiag.engine.pagepool import PagePool
from tierdiag.engine.rows import copy_rows

pytestmark = pytest.mark.skipif(cuda_device_present(), reason="a GPU machine's replay uses torch for its CUDA pools")


def _trace(path, n=40):
    lines = []
    for i in range(n):
        # three shared prefixes of two blocks, then a request's own block: hits, misses, evictions
        prefix = [1000 * (i % 3) + j for j in range(2)]
        lines.append(json.dumps({"timestamp": i * 50, "input_length": 1500, "output_length": 40,
                                 "hash_ids": prefix + [10_000 + i]}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("extra", [(), ("--storage-tokens", "20000", "--verify", "all")])
def test_cpu_replay_does_not_import_torch(tmp_path, extra):
    trace = _trace(tmp_path / "t.jsonl")
    code, out, err, heavy = run_cli("replay", str(trace), "--db", str(tmp_path / "r.duckdb"), "--model", "tiny",
                                    "--gpu", "cpu", "--device-tokens", "4096", "--host-tokens", "16384",
                                    "--json", *extra, watch=("torch",))
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "complete" and result["num_requests"] == 40
    assert result["load_backs"] > 0  # the copy paths ran: host -> device, with verification
    assert heavy == [], "a CPU replay imported torch"


def test_cpu_pool_tensor_is_the_same_memory():
    plane = DataPlane(num_layers=2, page_elems=4, device="cpu", pinned_host=False, modelled_page_bytes=1 << 20)
    dev = PagePool("device", 8, plane, on_device=True)
    host = PagePool("host", 8, plane, on_device=False)
    assert isinstance(dev.array, np.ndarray) and dev.array.shape == (2, 8, 4)
    write_content(dev, [3, 5], [11, 12])
    copy_rows(dev.rows, [3, 5], host.rows, [0, 1])
    assert verify_content(host, [0, 1], [11, 12])
    tensor = host.buffer  # torch, imported here on first use
    assert tensor.data_ptr() == host.array.ctypes.data and tuple(tensor.shape) == (2, 8, 4)
    tensor[1, 0, 2] ^= 1  # a bit flipped through torch shows through the numpy rows
    assert not verify_content(host, [0, 1], [11, 12])
    assert host.buffer is tensor
