"""The call path's own rules: fallback warnings, MXQ_STRICT, prepare() on CPU tensors."""

import warnings

import pytest
import torch

import mxq
from mxq import runtime


def test_fallback_warns_once_per_reason(monkeypatch):
    monkeypatch.delenv("MXQ_STRICT", raising=False)
    runtime._warned.discard("test reason")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runtime.fallback("test reason")
        runtime.fallback("test reason")
    assert [str(w.message) for w in caught] == [
        "mxq: running the torch reference instead of a GPU kernel: test reason"]


def test_strict_mode_turns_fallback_into_an_error(monkeypatch):
    monkeypatch.setenv("MXQ_STRICT", "1")
    with pytest.raises(RuntimeError, match="MXQ_STRICT"):
        runtime.fallback("another reason")


def test_prepare_needs_cuda_tensors():
    op = mxq.fused_quant()(_ident)
    with pytest.raises(ValueError, match="CUDA"):
        op.prepare(torch.randn(4, 32))


def test_out_must_be_contiguous():
    x = torch.randn(64, 64)
    out = mxq.quantize(x, colwise=True)
    out.colwise_scale = torch.empty(64, 2, dtype=torch.uint8).t()  # right shape, not contiguous
    with pytest.raises(ValueError, match="contiguous"):
        mxq.quantize(x, colwise=True, out=out)


def _ident(x):
    return x
