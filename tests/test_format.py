"""mxq/formats/format.py: a Format is a plain, validated value; MXFP8 is one instance of it."""

import pytest

from mxq.formats.format import Format


def test_mxfp8_by_hand():
    """OCP MX v1.0: 1x32 blocks (32x1 colwise), 8-bit elements one per byte, E8M0 scales."""
    f = Format.mxfp8("e5m2", "floor", "swizzled")
    assert f.block == (1, 32) and f.col_block == (32, 1)
    assert f.element == "e5m2" and f.elem.bits == 8 and f.elem.per_byte == 1 and f.elem.max == 57344.0
    assert Format.mxfp8("e4m3", "rceil", "compact").elem.max == 448.0
    assert f.scale == "e8m0" and f.scale_enc.bits == 8 and f.rule == "floor"
    assert f.swizzled and not Format.mxfp8("e4m3", "rceil", "compact").swizzled
    assert not f.global_scale


def test_repr_round_trips():
    """A generated module renders the config's repr: it must rebuild the same value."""
    f = Format.mxfp8("e4m3", "even", "compact")
    assert eval(repr(f), {"Format": Format}) == f


@pytest.mark.parametrize("kw,name", [
    (dict(element="e3m2"), "element"), (dict(scale="ue4m3"), "scale"), (dict(rule="up"), "rule"),
    (dict(layout="tiled"), "layout"), (dict(block=(0, 32)), "block"), (dict(block=[1, 32]), "block")])
def test_bad_fields_name_themselves(kw, name):
    base = dict(block=(1, 32), element="e4m3", scale="e8m0", rule="rceil", layout="compact")
    with pytest.raises(ValueError, match=f"Format.{name}"):
        Format(**{**base, **kw})
