"""Shared test helpers: deterministic inputs with planted specials, GPU marker handling."""

from __future__ import annotations

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
