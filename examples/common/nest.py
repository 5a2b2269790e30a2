"""Small helpers for nested dicts / lists / tuples (including namedtuples) of tensors.

Anything that is not a dict, list or tuple is a leaf. Dicts are traversed in insertion order,
so flatten() and pack_as() agree with each other and with the order the nest was built in.

Meant to be used as ``from examples.common import nest; nest.map(fn, x)``.
"""

from collections.abc import Callable, Iterator
from typing import Any


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _rebuild(template: Any, children: list) -> Any:
    """A container of the same type as `template` holding `children`."""
    if isinstance(template, dict):
        return type(template)(zip(template.keys(), children, strict=True))
    if _is_namedtuple(template):
        return type(template)(*children)
    return type(template)(children)


def _children(x: Any) -> list:
    return list(x.values()) if isinstance(x, dict) else list(x)


def _is_container(x: Any) -> bool:
    return isinstance(x, dict | list | tuple)


def map(fn: Callable[[Any], Any], nest: Any) -> Any:
    """Apply fn to every leaf, keeping the structure."""
    if _is_container(nest):
        return _rebuild(nest, [map(fn, child) for child in _children(nest)])
    return fn(nest)


def map_many(fn: Callable[..., Any], *nests: Any) -> Any:
    """Apply fn(*leaves) across nests that share one structure, e.g. to stack a list of nests."""
    first = nests[0]
    if not _is_container(first):
        return fn(*nests)
    for other in nests[1:]:
        if type(other) is not type(first) or len(other) != len(first):
            raise ValueError(f"nests differ in structure: {type(first)} vs {type(other)}")
        if isinstance(first, dict) and list(other.keys()) != list(first.keys()):
            raise ValueError(f"dict keys differ: {list(first)} vs {list(other)}")
    columns = zip(*(_children(n) for n in nests), strict=True)
    return _rebuild(first, [map_many(fn, *column) for column in columns])


def flatten(nest: Any) -> list:
    """All leaves, depth first."""
    if _is_container(nest):
        return [leaf for child in _children(nest) for leaf in flatten(child)]
    return [nest]


def pack_as(nest: Any, flat: list) -> Any:
    """Inverse of flatten: put the leaves of `flat` back into the structure of `nest`."""
    leaves = iter(flat)
    packed = _pack(nest, leaves)
    if next(leaves, _SENTINEL) is not _SENTINEL:
        raise ValueError("too many leaves for this structure")
    return packed


_SENTINEL = object()


def _pack(nest: Any, leaves: Iterator) -> Any:
    if _is_container(nest):
        return _rebuild(nest, [_pack(child, leaves) for child in _children(nest)])
    leaf = next(leaves, _SENTINEL)
    if leaf is _SENTINEL:
        raise ValueError("too few leaves for this structure")
    return leaf
