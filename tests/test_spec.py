"""QuantSpec validation and its 32-bit key."""

import itertools

import pytest

from mxq import QuantSpec
from mxq.frontend.spec import ACTIVATIONS, DTYPE_NAMES


def all_specs():
    for fp8, rw, cw, mode, layout, amax, dbias in itertools.product(
            ("e4m3", "e5m2"), (True, False), (True, False), ("rceil", "floor", "ceil", "even"),
            ("compact", "swizzled"), (False, True), (False, True)):
        if not (rw or cw):
            continue
        for act, dact in [(None, None)] + [(a, None) for a in ACTIVATIONS] + [(None, a) for a in ACTIVATIONS]:
            yield QuantSpec(fp8, rw, cw, mode, layout, amax, act, dact, dbias)


def test_key_round_trips_and_is_unique():
    seen = {}
    for spec in all_specs():
        for dtype in DTYPE_NAMES:
            k = spec.key(dtype)
            assert 0 <= k < 1 << 16
            assert k not in seen, (spec, seen.get(k))
            seen[k] = spec
            assert QuantSpec.from_key(k) == (spec, dtype)
    assert len(seen) == len(set(seen))


def test_key_bits_documented():
    s = QuantSpec(fp8="e5m2", rowwise=True, colwise=True, scale_mode="floor", scale_layout="swizzled",
                  amax=True, act="relu", dbias=True)
    assert s.key("bf16") == 1 | 2 | 4 | (1 << 3) | (1 << 5) | (1 << 6) | (3 << 7) | (1 << 13) | (2 << 14)


@pytest.mark.parametrize("kwargs,word", [
    ({"fp8": "e3m4"}, "fp8"), ({"scale_mode": "round"}, "scale_mode"), ({"scale_layout": "tiled"}, "scale_layout"),
    ({"act": "tanh"}, "act"), ({"dact": "swish"}, "dact"), ({"act": "gelu", "dact": "gelu"}, "exclusive"),
    ({"rowwise": False, "colwise": False}, "rowwise"), ({"amax": 1}, "amax"), ({"dbias": "yes"}, "dbias"),
])
def test_invalid_specs_name_the_option(kwargs, word):
    with pytest.raises((ValueError, TypeError), match=word):
        QuantSpec(**kwargs)


def test_every_key_taken_is_its_specs_own():
    """from_key(k) either refuses k or gives the spec whose key is k (a C++ caller's hand-made key
    names exactly the op it gets): 40,000 keys drawn over the 22 bits, and NVFP4's without amax."""
    import random

    rng = random.Random(7)
    formats = []
    for k in [0x80002] + [rng.getrandbits(22) for _ in range(40000)]:
        try:
            spec, dtype = QuantSpec.from_key(k)
        except ValueError:
            continue
        formats.append(spec.format)
        assert spec.key(dtype) == k, hex(k)
    assert len(formats) > 200 and len(set(formats)) == 4  # (the draw reaches accepted keys of every format)


@pytest.mark.parametrize("key", [-1, 1 << 16, 7 << 7, 3 << 14, "3", 1 << 19 | 2])
def test_bad_keys(key):
    with pytest.raises(ValueError, match="key"):
        QuantSpec.from_key(key)
