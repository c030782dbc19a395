"""mxq/tensor.py: MXFP8Tensor as a saved object."""

import io

import torch

import mxq
from mxq.testing import compare


def test_saved_tensors_load_back_with_torch_defaults():
    """torch.save / torch.load with torch's default weights_only=True: the fields come back
    byte-equal, views of padded rows keep their strides, grouped tensors their offsets."""
    x = torch.randn(64, 64)
    cases = [mxq.quantize(x, colwise=True, amax=True),
             mxq.quantize(x[:, :13], scale_layout="swizzled", fp8="e5m2"),  # N % 8 != 0: padded rows
             mxq.quantize(x[:, :32], colwise=True, group_offsets=torch.tensor([20, 64]))]
    for t in cases:
        buf = io.BytesIO()
        torch.save(t, buf)
        buf.seek(0)
        u = torch.load(buf, weights_only=True)  # (torch's default, stated: an environment variable can change it)
        assert type(u) is mxq.MXFP8Tensor
        assert (u.fp8, u.scale_layout, u.shape) == (t.fp8, t.scale_layout, t.shape)
        assert compare(u, t, exact=True) == []
        for f in ("rowwise_data", "colwise_data"):
            if getattr(t, f) is not None:
                assert getattr(u, f).stride() == getattr(t, f).stride(), f
        assert (u.group_offsets is None) == (t.group_offsets is None)
        if t.group_offsets is not None:
            assert torch.equal(u.group_offsets, t.group_offsets)
            assert compare(u.group(0), t.group(0), exact=True) == []
