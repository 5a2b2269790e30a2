"""MinAtar's SpaceInvaders, the same game step for step, with less of numpy's per-call overhead.

On its 10x10 grids numpy's Python-level wrappers cost more than the work: ``np.roll`` (two or
three calls a step, bullets and aliens) and ``np.sum`` (its dispatch through
``_wrapreduction``) are about a sixth of the CPU time of a step of SpaceInvaders, the game whose
env worker is the busiest of the five (docs/results.md). MinAtar's game modules look ``np``
up in their own namespace at each call, so ``install()`` gives the SpaceInvaders module a numpy
whose ``roll`` slices and concatenates and whose ``sum`` goes straight to the array's method;
everything else is numpy itself. The games are the same: tests/unit/test_minatar_speedup.py
replays seeded episodes both ways.
"""

import types

import numpy as np


def roll(a, shift, axis=None):
    """``np.roll(a, shift, axis)``; an integer shift along one axis is done by slicing."""
    if not isinstance(shift, (int, np.integer)) or not isinstance(axis, (int, np.integer)):
        return np.roll(a, shift, axis)
    a = np.asanyarray(a)
    size = a.shape[axis]
    shift = int(shift) % size if size else 0
    if shift == 0:
        return a.copy()
    before = (slice(None),) * (axis % a.ndim)
    tail = a[(*before, slice(size - shift, None))]
    head = a[(*before, slice(None, size - shift))]
    return np.concatenate((tail, head), axis=axis)


def array_sum(a, *args, **kwargs):
    """``np.sum``; an ndarray's own ``sum`` for an ndarray (the same reduction)."""
    if type(a) is np.ndarray:
        return a.sum(*args, **kwargs)
    return np.sum(a, *args, **kwargs)


class LeanNumpy(types.ModuleType):
    """numpy, but for ``roll`` and ``sum``."""

    def __init__(self):
        super().__init__("numpy")

    def __getattr__(self, name):
        return getattr(np, name)

    roll = staticmethod(roll)
    sum = staticmethod(array_sum)


def install():
    """Give MinAtar's SpaceInvaders the leaner numpy (imports minatar; once per process)."""
    from minatar.environments import space_invaders

    if not isinstance(space_invaders.np, LeanNumpy):
        space_invaders.np = LeanNumpy()
