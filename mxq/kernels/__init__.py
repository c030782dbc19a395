"""mxq's kernel layer: every quantize kernel, written once as CuTeDSL.

- ``config``: KernelConfig (what a kernel is specialised on: a Format, mxq/formats/format.py,
  and the op's shape of work) and Tuning (a benchmark's switches, in no library module).
- ``element``: ElementOp, the op applied per element (epilogue, act, dact, two halves).
- ``codec``: a Format's device side (scale rule, element encoding, where scale bytes go).
- ``smem``: shared memory declared once (the buffers a kernel allocates and their byte count).
- ``device``: helpers traced into the kernels (E8M0 rules, FP8 conversion, packed math, PTX).
- ``generic``, ``vectorized``, ``packed``: the three quantize kernels (fp32 at any shape; fp32
  aligned; 16-bit, aligned or through ``unaligned``'s rows), each a class holding the config
  and the ElementOp, with one ``@cute.kernel`` method.
- ``unaligned``: the packed kernel's loads and stores for rows at any alignment.
- ``reduce``: amax zeroing and the ordered dbias reduction.
- ``quantize``: Quantize, which a generated module instantiates with its config and element
  functions; it composes the three kernels and its ``launch`` picks and launches them.

docs/DESIGN.md describes how a generated module (``FusedOp.source``) uses this package.
"""
