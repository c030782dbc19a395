"""Gated activations: ``act=`` / ``dact=`` "swiglu", "geglu", "reglu", "qgeglu", "sreglu"
(TransformerEngine's set and conventions; docs/NUMERICS.md, "Gated activations").

The input of a gated op is [..., 2N]: its first half is the gate g, which goes through the
activation, its second half u multiplies it. With the op's epilogue E applied element-wise first:

- forward (``act=``): out = act(E(g)) * E(u), quantized as [..., N];
- backward (``dact=``): the incoming gradient d = E(inputs) is [..., N] and ``act_input`` the
  forward's [..., 2N] input; out[..., :N] = (d * u) * dact(g) and out[..., N:] = d * act(g),
  quantized as one [..., 2N] tensor (dbias over 2N columns).

Both are ordinary fused ops over views of the halves, built here as derived epilogues from the
op's own IR and the activations' one definition (mxq/frontend/activations.py):

- the forward op's epilogue takes each tensor parameter twice (its gate half, then its up half;
  messages name both by the user's parameter, Epilogue.shown_params): a user epilogue
  ``act(g) * u`` over ``x[..., :N]`` and ``x[..., N:]`` computes the same bytes;
- the backward op's epilogue takes the user's tensors, then g and u, and a last float parameter
  ``_mxq_half`` (HALF) that the kernels set themselves: an epilogue ending in that parameter
  writes an output twice as wide, out[:, h N + j] = E(inputs[:, j], h) for h = 0, 1 (one launch;
  the grid's column tiles are doubled, both halves' CTAs read the same input tiles).
"""

from __future__ import annotations

import hashlib
import inspect

from . import activations, ir
from .epilogue import Epilogue
from .spec import GATED_ACTIVATIONS as GATED
HALF = "_mxq_half"  # the reserved last float parameter of a two-halves epilogue
RESERVED_PREFIX = "_mxq_"  # parameter names user epilogues may not use


def is_gated(name) -> bool:
    return name in GATED


def is_halves(epilogue: Epilogue) -> bool:
    """Whether ``epilogue`` writes two halves side by side (its last float parameter is HALF)."""
    return bool(epilogue.scalar_params) and epilogue.scalar_params[-1] == HALF


def launch_scalars(epilogue: Epilogue) -> int:
    """The float parameters a caller passes to the kernels (HALF is the kernels' own)."""
    return len(epilogue.scalar_params) - is_halves(epilogue)


def double_last(shape):
    """``shape`` with its last dimension doubled (a torch.Size stays one)."""
    return type(shape)((*shape[:-1], 2 * shape[-1])) if isinstance(shape, tuple) else (*shape[:-1], 2 * shape[-1])


def out_shape(epilogue: Epilogue, shape):
    """The op's output shape for a first input of ``shape``."""
    return double_last(shape) if is_halves(epilogue) else shape


def _apply(fn_name: str, backward: bool, x: ir.Expr, builtin: set) -> ir.Expr:
    """act(x) (or dact(x)) as IR; its own nodes join ``builtin`` (lowered as act=/dact= are)."""
    e = activations.dact_ir(fn_name) if backward else activations.act_ir(fn_name)
    applied = ir.substitute(e.expr, {0: x})
    builtin |= ir.applied_nodes(applied, [x])
    return applied


def _derived(user: Epilogue, kind: str, act: str, tensor_params, scalar_params, expr, builtin, shown) -> Epilogue:
    h = hashlib.sha256(f"mxq-gated-v1\0{kind}\0{act}\0{user.fingerprint}\0".encode())
    h.update(ir.serialize(expr).encode())
    defaults = user.scalar_defaults + ((0.0,) if scalar_params[-1:] == (HALF,) else ())
    return Epilogue(name=f"{user.name}_{kind}_{act}", tensor_params=tuple(tensor_params),
                    scalar_params=tuple(scalar_params), scalar_defaults=defaults,
                    param_order=tuple(tensor_params) + tuple(scalar_params), expr=expr,
                    fingerprint=h.hexdigest()[:32], captured=user.captured,
                    builtin=frozenset(builtin) & frozenset(ir.walk(expr)), shown_params=tuple(shown))


def forward_epilogue(user: Epilogue, act: str) -> Epilogue:
    """act(E(gate halves)) * E(up halves): tensor parameters (p for p in user's: gate halves),
    then (_mxq_up_p: up halves), then the user's floats."""
    k = len(user.tensor_params)
    ups = [ir.TensorArg(f"{RESERVED_PREFIX}up_{p}", k + i) for i, p in enumerate(user.tensor_params)]
    up = ir.substitute(user.expr, dict(enumerate(ups)))
    builtin = set(user.builtin) | {ir.substitute(n, dict(enumerate(ups))) for n in user.builtin}
    expr = ir.Binary("mul", _apply(GATED[act], False, user.expr, builtin), up)
    return _derived(user, "fwd", act, (*user.tensor_params, *(u.name for u in ups)), user.scalar_params, expr,
                    builtin, user.tensor_params * 2)


def backward_epilogue(user: Epilogue, dact: str) -> Epilogue:
    """Half 0: (E * u) * dact(g); half 1: E * act(g). Tensor parameters: the user's, then
    _mxq_gate and _mxq_up (the halves of act_input); floats: the user's, then HALF."""
    k = len(user.tensor_params)
    g = ir.TensorArg(f"{RESERVED_PREFIX}gate", k)
    u = ir.TensorArg(f"{RESERVED_PREFIX}up", k + 1)
    half = ir.ScalarArg(HALF, len(user.scalar_params))
    base = GATED[dact]
    builtin = set(user.builtin)
    d_gate = ir.Binary("mul", ir.Binary("mul", user.expr, u), _apply(base, True, g, builtin))
    d_up = ir.Binary("mul", user.expr, _apply(base, False, g, builtin))
    expr = ir.Where(ir.Compare("eq", half, ir.Const(0.0)), d_gate, d_up)
    return _derived(user, "bwd", dact, (*user.tensor_params, g.name, u.name), (*user.scalar_params, HALF), expr,
                    builtin, (*user.tensor_params, "act_input", "act_input"))


def signature(epilogue: Epilogue) -> inspect.Signature:
    """A positional signature for a derived epilogue's parameters (what FusedOp binds by)."""
    P = inspect.Parameter
    return inspect.Signature([P(n, P.POSITIONAL_OR_KEYWORD) for n in epilogue.param_order])


def function_of(epilogue: Epilogue):
    """A function standing for a derived epilogue: its name and signature are what FusedOp binds
    calls by (it runs the IR; the function itself is never called)."""
    def derived_fn(*args):
        raise TypeError("mxq: internal derived epilogue")

    derived_fn.__signature__ = signature(epilogue)
    derived_fn.__name__ = derived_fn.__qualname__ = epilogue.name
    return derived_fn


__all__ = ["GATED", "HALF", "backward_epilogue", "forward_epilogue", "function_of", "is_gated", "is_halves",
           "launch_scalars", "out_shape"]
