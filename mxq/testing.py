"""Test-data helpers shared by the test suite, the device check and users' own tests."""

from __future__ import annotations

import torch


def planted(m: int, n: int, dtype=torch.float32, seed: int = 0, scale: float = 1.0,
            specials: bool = True, device="cpu") -> torch.Tensor:
    """Random normal data times ``scale`` with +-0, NaN, +-inf, fp32 subnormals, an all-zero
    block and a huge block planted at fixed places (where the shape has room for them)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((m, n), generator=g, dtype=torch.float32) * scale
    if specials and m * n:
        flat = x.view(-1)
        picks = torch.randperm(flat.numel(), generator=g)
        vals = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-40, -3e-39, 2.0 ** -130]
        for v, p in zip(vals, picks[: len(vals)].tolist()):
            flat[p] = v
        if m >= 2 and n >= 64:
            x[1, 32:64] = 0.0  # an all-zero block
        if m >= 4 and n >= 32:
            x[3, :32] *= 1e30 if dtype == torch.float32 else 1e3  # a huge block
    return x.to(dtype).to(device)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN-safe) of two tensors of one dtype and shape."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.reshape(-1).view(torch.uint8).cpu(), b.reshape(-1).view(torch.uint8).cpu())
