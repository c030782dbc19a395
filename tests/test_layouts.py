"""Scale shapes and the 128x4 swizzle: the torch view against the closed-form offset."""

import pytest
import torch

from mxq.formats import layouts

from . import oracle


@pytest.mark.parametrize("rows,blocks", [(1, 1), (5, 3), (128, 4), (130, 9), (257, 16), (300, 1)])
def test_swizzle_matches_offset_formula(rows, blocks):
    s = torch.randint(1, 255, (rows, blocks), dtype=torch.uint8)
    sw = layouts.swizzle(s)
    assert sw.shape == (layouts.roundup(rows, 128), layouts.roundup(blocks, 4))
    flat = sw.reshape(-1)
    written = torch.zeros_like(flat, dtype=torch.bool)
    for i in range(rows):
        for j in range(blocks):
            off = oracle.swizzle_offset(i, j, blocks)
            assert off == layouts.swizzle_offset(i, j, blocks)
            assert flat[off] == s[i, j]
            written[off] = True
    assert torch.all(flat[~written] == 0), "padding must be zero bytes"


@pytest.mark.parametrize("rows,blocks", [(1, 1), (130, 9), (256, 8)])
def test_unswizzle_round_trip(rows, blocks):
    s = torch.randint(0, 256, (rows, blocks), dtype=torch.uint8)
    assert torch.equal(layouts.unswizzle(layouts.swizzle(s), rows, blocks), s)


def test_known_offsets():
    # worked by hand from the formula: (i=33, j=5, 9 blocks -> T=3): (0*3+1)*512 + 1*16 + 1*4 + 1
    assert layouts.swizzle_offset(33, 5, 9) == 512 + 16 + 4 + 1
    assert layouts.swizzle_offset(128, 0, 9) == 3 * 512
    assert layouts.swizzle_offset(31, 3, 4) == 31 * 16 + 3


@pytest.mark.parametrize("m,n", [(1, 1), (31, 33), (128, 128), (4095, 100)])
def test_scale_shapes(m, n):
    assert layouts.rowwise_scale_shape(m, n, "compact") == (m, -(-n // 32))
    assert layouts.colwise_scale_shape(m, n, "compact") == (-(-m // 32), n)
    r = layouts.rowwise_scale_shape(m, n, "swizzled")
    c = layouts.colwise_scale_shape(m, n, "swizzled")
    assert r[0] % 128 == 0 and r[1] % 4 == 0 and c[0] % 4 == 0 and c[1] % 128 == 0


def test_colwise_swizzle_is_transpose_swizzle():
    m, n = 70, 130
    s = torch.randint(0, 256, (-(-m // 32), n), dtype=torch.uint8)  # compact colwise [ceil(M/32), N]
    buf = layouts.to_layout_colwise(s, "swizzled")
    assert buf.shape == layouts.colwise_scale_shape(m, n, "swizzled")
    flat = buf.reshape(-1)
    for col in range(n):
        for b in range(s.shape[0]):
            assert flat[oracle.swizzle_offset(col, b, s.shape[0])] == s[b, col]
    assert torch.equal(layouts.compact_colwise(buf, m, n, "swizzled"), s)
