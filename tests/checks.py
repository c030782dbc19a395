"""A kernel call's outputs against the reference's, for the kernel tests of every format."""

from __future__ import annotations

import torch

from mxq.testing import same_bytes

OUTPUTS = ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "colwise_amax", "dbias")


def check_exact(op, ins, got, **kw):
    """Every output the reference of ``op`` on ``ins`` (and keywords ``kw``) has, byte-equal to
    ``got``'s (the exact class), but dbias within one ulp of the input dtype (the kernels sum in
    another order) and a NaN amax any NaN (mxq.testing.compare's rules)."""
    want = op.reference(*ins, **kw)
    for f in OUTPUTS:
        w = getattr(want, f)
        if w is None:
            continue
        g = getattr(got, f)
        assert g is not None, f
        if f == "dbias":
            gd, wd = g.cpu().double(), w.double()
            ulp = torch.finfo(w.dtype).eps * wd.abs() + torch.finfo(w.dtype).tiny
            assert bool((((gd - wd).abs() <= ulp) | (gd == wd) | (gd.isnan() & wd.isnan())).all()), f
        elif f in ("amax", "colwise_amax"):
            assert same_bytes(g, w) or bool((g.isnan().cpu() & w.isnan()).all()), f
        else:
            assert same_bytes(g.contiguous(), w.contiguous()), f


def child_gets_fresh_locks(*where) -> bool:
    """Whether a child forked while another thread of this process held each lock ``where`` names
    ((module, name): as a thread compiling or decorating at the fork does) finds every one of them
    free (an RLock too: the holder is not the forking thread)."""
    import os
    import threading

    held, done = threading.Event(), threading.Event()

    def hold():
        locks = [getattr(module, name) for module, name in where]
        for lock in locks:
            lock.acquire()
        held.set()
        done.wait()
        for lock in locks:
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if all(getattr(module, name).acquire(timeout=5) for module, name in where) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        done.set()
        holder.join()
    return os.waitstatus_to_exitcode(status) == 0
