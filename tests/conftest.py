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
