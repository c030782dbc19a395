"""mxq's kernel layer: every quantize kernel, written once as CuTeDSL.

- ``config``: KernelConfig (what a kernel is specialised on) and Tuning (benchmark switches).
- ``device``: helpers traced into the kernels (E8M0 rules, FP8 conversion, packed math, PTX).
- ``generic``, ``vectorized``, ``packed``: the three quantize kernels (fp32 at any shape; fp32
  aligned; 16-bit, aligned or through ``unaligned``'s rows), each a class with one
  ``@cute.kernel`` method.
- ``unaligned``: the packed kernel's loads and stores for rows at any alignment.
- ``reduce``: amax zeroing and the ordered dbias reduction.
- ``quantize``: Quantize, which a generated module instantiates with its config and element
  functions, and whose ``launch`` picks and launches the kernels.

docs/DESIGN.md describes how a generated module (``FusedOp.source``) uses this package.
"""
