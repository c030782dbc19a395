"""A decorator module for tests/test_epilogue.py: a functools.wraps wrapper whose module has a
global of the same name as the user's (an epilogue must read the user's)."""

import functools

K_CAPTURE = 100.0


def passthrough(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args) * K_CAPTURE / K_CAPTURE

    return wrapper
