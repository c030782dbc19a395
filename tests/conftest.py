"""Shared test helpers: deterministic inputs with planted specials, GPU marker handling."""

from __future__ import annotations

import contextlib
import signal

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


from mxq.testing import planted  # noqa: E402,F401  (re-exported for the tests)


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail (instead of hanging) when the body runs past ``seconds``: a guard against
    exponential time, far above what the linear code needs (milliseconds)."""

    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: not linear time")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="session")
def raw_caller():
    """tests/cpp/raw_caller.cc, built: a function's call with raw DLTensor* arguments, one of them
    spoiled (test_export_check.py, test_ffi.py)."""
    from pathlib import Path

    import tvm_ffi.cpp

    src = (Path(__file__).parent / "cpp" / "raw_caller.cc").read_text()
    return tvm_ffi.cpp.load_inline(name="mxq_test_raw_caller", cpp_sources=src, functions=["raw_call_error"])


@pytest.fixture(scope="session")
def on_cuda():
    """tests/cpp/on_cuda.cc, built: a torch tensor as a tvm-ffi tensor labelled as on CUDA device 0
    over the same host memory (a 0-d tensor, e.g. amax, as its one element: what C++ callers pass);
    anything else (None, a float) as it is."""
    from pathlib import Path

    import tvm_ffi
    import tvm_ffi.cpp

    src = (Path(__file__).parent / "cpp" / "on_cuda.cc").read_text()
    mod = tvm_ffi.cpp.load_inline(name="mxq_test_on_cuda", cpp_sources=src, functions=["on_cuda"])
    return lambda t: t if not isinstance(t, torch.Tensor) else mod.on_cuda(
        tvm_ffi.from_dlpack(t.reshape(1) if t.dim() == 0 else t))


@pytest.fixture
def native(monkeypatch, on_cuda):
    """(call, launches): call(op, x, *slots) runs op's dispatcher on x and the slots labelled as
    CUDA (on_cuda); each launch is (dtype, variant, [(shape, strides, address) or float of each
    kernel argument]): the kernel is a stand-in resolved through ffi's own resolve (limits.cpp_gap
    first), recording what it got."""
    import tvm_ffi

    from mxq.runtime import compiler, targets

    launches = []

    def stand_in(op, arch, dtype, variant, layouts):
        def kernel(*args):
            launches.append((dtype, variant, [(tuple(a.shape), tuple(a.strides), a.data_ptr())
                                              if isinstance(a, tvm_ffi.Tensor) else a for a in args]))
        return tvm_ffi.convert(kernel)

    monkeypatch.setattr(targets, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(compiler, "native_function", stand_in)

    def call(op, x, *slots):
        return op.dispatcher()(on_cuda(x), *(on_cuda(t) for t in slots))

    return call, launches
