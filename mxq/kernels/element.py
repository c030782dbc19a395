"""ElementOp: the op a kernel applies to each element, as trace-time pieces.

A generated module hands its lowered epilogue, act and dact functions to ``Quantize``, which
wraps them with the config in one ``ElementOp`` shared by every kernel. Its methods run at trace
time inside a kernel body and branch only on the config: which tensors are read per element,
the value that is quantized (docs/NUMERICS.md steps 1-5), the dbias partial sums, and the
two-halves split of a gated op (mxq/gated.py).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from . import device as dev


class ElementOp:
    def __init__(self, cfg, epilogue, act=None, dact=None):
        if (act is not None) != cfg.has_act or (dact is not None) != cfg.has_dact:
            raise ValueError("mxq: Quantize needs an act (dact) function exactly when the config has one")
        self.cfg = cfg
        self.epilogue = epilogue
        self.act = act
        self.dact = dact

    def sources(self, ins, act_in) -> list:
        """The tensors read per element: the epilogue's inputs, then act_input (dact ops)."""
        return list(ins) + ([act_in] if self.cfg.has_dact else [])

    def value(self, srcs, k, scalars, load):
        """The value v that is quantized (NUMERICS steps 1-4): the epilogue of the inputs, then
        act(v), or v * dact(act_input). ``load(src, k)`` reads element k of a source as fp32."""
        cfg = self.cfg
        v = self.epilogue(*[load(srcs[t], k) for t in range(cfg.n_inputs)], *scalars)
        if cfg.has_act:
            v = self.act(v)
        if cfg.has_dact:
            a = load(srcs[cfg.n_inputs], k)
            v = dev.mul_rn(v, self.dact(a))
        return v

    def round_to_input(self, v, dtype):
        """NUMERICS step 5: a computed value is rounded to the input format (16-bit inputs)."""
        if self.cfg.computed and dtype is not Float32:
            return v.to(dtype).to(Float32)
        return v

    def dbias_zero(self, dbias_ws):
        """A partial dbias sum's start, in the workspace's precision (None without dbias)."""
        return dbias_ws.element_type(0.0) if self.cfg.dbias else None

    def dbias_add(self, dsum, v, dbias_ws):
        return dsum + v.to(dbias_ws.element_type) if self.cfg.dbias else dsum

    def output_half(self, cb, N, NO, tile_cols: int, scalars, divby: int = 1, passes: int = 1):
        """(column tile, output column offset, output width, scalars) of grid column index cb.
        A two-halves op (KernelConfig.halves, mxq/gated.py) has every input column tile twice in
        its grid: the second copy writes half 1, at column offset N of the NO = 2N wide outputs,
        and passes HALF = 1 to its epilogue. ``divby``: what N is known to be a multiple of.
        ``passes`` 2 (the packed kernel's KernelConfig.halves_passes): the grid is not doubled
        and the kernel writes both halves itself (pass_half)."""
        if not self.cfg.halves:
            return cb, 0, N, scalars
        if passes == 2:
            return cb, 0, NO, scalars
        ncb = (N + tile_cols - 1) // tile_cols
        h = Int32(cutlass.select_(cb >= ncb, Int32(1), Int32(0)))
        co = cute.assume(h * N, divby=divby) if divby > 1 else h * N
        return cb - h * ncb, co, NO, list(scalars) + [h.to(Float32)]

    def pass_half(self, h: int, N, scalars, divby: int = 1):
        """(output column offset, scalars) of pass h of a kernel writing both halves itself."""
        co = cute.assume(Int32(h) * N, divby=divby) if divby > 1 else Int32(h) * N
        return co, list(scalars) + [Float32(float(h))]

    def out_col(self, co, c):
        """Output column of column ``c`` of a CTA whose outputs start at column ``co``: ``co + c``
        for a two-halves op, ``c`` itself otherwise (where ``co`` is 0, adding it would cost the
        index its known divisibility and change the code)."""
        return co + c if self.cfg.halves else c

    def out_window(self, t, co):
        """Output tensor ``t`` from column ``co`` on (two-halves ops; else ``t`` itself)."""
        return cute.domain_offset((0, co), t) if self.cfg.halves and t is not None else t


__all__ = ["ElementOp"]
