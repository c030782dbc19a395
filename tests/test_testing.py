"""The comparison helpers used by the GPU tests and the device check catch what they must."""

import torch

import mxq
from mxq.testing import compare, planted, poisoned


def test_compare_flags_a_single_byte_and_accepts_equal():
    x = planted(40, 70, torch.bfloat16, seed=1)
    want = mxq.quantize(x, rowwise=True, colwise=True, amax=True)
    got = mxq.quantize(x, rowwise=True, colwise=True, amax=True)
    assert compare(got, want, exact=True) == []
    got.colwise_data.view(torch.uint8)[3, 4] ^= 1
    assert compare(got, want, exact=True) == ["colwise_data: 1 bytes differ (worst by 1)"]
    assert compare(got, want, exact=False) == []  # one code, one byte: allowed in the transcendental class
    got.rowwise_scale[0, 0] ^= 2
    assert any("rowwise_scale" in p for p in compare(got, want, exact=True))
    got.amax.fill_(1.0)
    assert any("amax" in p for p in compare(got, want, exact=False))


def test_poisoned_outputs_are_not_valid_results():
    op = mxq.fused_quant(colwise=True, dbias=True, amax=True)(lambda_free)
    x = planted(40, 70, seed=2)
    out = poisoned(op, x)
    assert compare(out, op.reference(x), exact=False) != []
    assert compare(op(x, out=out), op.reference(x), exact=True) == []


def lambda_free(x):
    return x
