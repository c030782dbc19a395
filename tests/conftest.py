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


def planted(m: int, n: int, dtype=torch.float32, seed: int = 0, scale: float = 1.0,
            specials: bool = True) -> torch.Tensor:
    """Random normal data times ``scale`` with +-0, NaN, +-inf, subnormals, an all-zero block and
    a huge block planted at fixed positions (where the shape has room for them)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((m, n), generator=g, dtype=torch.float32) * scale
    if specials and m * n:
        flat = x.view(-1)
        k = flat.numel()
        picks = torch.randperm(k, generator=g)
        vals = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-40, -3e-39,
                torch.finfo(dtype).tiny / 4 if dtype == torch.float32 else 0.0]
        for v, p in zip(vals, picks[: len(vals)].tolist()):
            flat[p] = v
        if m >= 2 and n >= 40:
            x[1, 32:64] = 0.0  # an all-zero block
            x[min(m - 1, 3), :32] *= 1e30 if dtype == torch.float32 else 1e3  # a huge block
    return x.to(dtype)
