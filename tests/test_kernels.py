"""spade_lib.decoding.kernels: every candidate computes x W^T + b; the plan keeps the fastest measured."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spade_lib import paths
from spade_lib.decoding import kernels


@pytest.fixture()
def fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(kernels, "_CHOSEN", {})
    return tmp_path


def weights(n=3, out=48, inp=32, bias=True):
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(out, inp, generator=g) for _ in range(n)]
    bs = [torch.randn(out, generator=g) if bias else None for _ in range(n)]
    return ws, bs


@pytest.mark.parametrize("policy", ["auto", *kernels.CANDIDATES])
def test_every_kernel_computes_the_same_product(fresh, policy):
    if policy != "mkl" and not kernels.packing_available(torch.device("cpu"), torch.float32):
        pytest.skip("oneDNN packing is not available in this torch build")
    ws, bs = weights()
    one, many = kernels.plan(ws, bs, policy=policy)
    x1, xk = torch.randn(1, 32), torch.randn(5, 32)
    with torch.inference_mode():
        for w, b, k1, kk in zip(ws, bs, one, many):
            torch.testing.assert_close(k1(x1), F.linear(x1, w, b), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(kk(xk), F.linear(xk, w, b), rtol=1e-5, atol=1e-5)
    assert "onednn_pad2" not in {k.name for k in many}  # the padded variant serves one row only


def test_auto_keeps_the_fastest_measured_and_caches_it(fresh):
    if not kernels.packing_available(torch.device("cpu"), torch.float32):
        pytest.skip("oneDNN packing is not available in this torch build")
    ws, bs = weights(bias=False)
    one, many = kernels.plan(ws, bs)
    chosen = {c["rows"]: c for c in kernels.choices()}
    assert set(chosen) == {"one", "many"}
    for rows, ks in (("one", one), ("many", many)):
        secs = chosen[rows]["seconds"]
        assert ks[0].name == min(secs, key=secs.get) == chosen[rows]["kernel"]
        assert chosen[rows]["threads"] == torch.get_num_threads() and chosen[rows]["shape"] == [48, 32]
    assert (fresh / "kernels" / "choices.json").is_file()
    # another process on this machine reads the same choice instead of timing again
    kernels._CHOSEN.clear()
    forced = {k: dict(v, kernel="mkl") for k, v in kernels._read_disk().items()}
    from spade_lib.io import write_json

    write_json(kernels._disk_path(), forced)
    one2, many2 = kernels.plan(ws, bs)
    assert one2[0].name == many2[0].name == "mkl"


def test_bad_policy_is_refused(fresh):
    ws, bs = weights()
    with pytest.raises(ValueError, match="policy: must be 'auto' or one of"):
        kernels.plan(ws, bs, policy="fast")
    with pytest.raises(ValueError, match="policy: 'onednn' needs oneDNN"):
        kernels.plan([w.double() for w in ws], None, policy="onednn")
    assert kernels.plan([], None) == ([], [])
