"""A request's JSON body, decoded within bounds (pure).

A small body can become a large tree: a megabyte of ``{}`` is about 25 MB of Python
objects, and a deep nesting ends the decoder in ``RecursionError``. :func:`read_json`
answers both with 400, and the costly ones before any decoding: a body with more than
``max_containers`` opening brackets (``{`` and ``[``, inside strings too: an upper
bound of its objects and arrays, counted in C) is refused unread, and a nesting deeper
than ``max_depth`` is refused after it. What a parse makes of a body is then bounded by
the limits, whatever the body. Invalid UTF-8 and invalid JSON are 400 too.
The caller keeps only what it reads out of the tree, never the tree or the raw bytes.
"""

from __future__ import annotations

import json

from graylane.services.gateway.failures import ApiError

__all__ = ["read_json"]


def read_json(raw: bytes, *, max_depth: int, max_containers: int) -> object:
    """``raw`` decoded; :class:`ApiError` (400) when it is not JSON or past the bounds."""
    if raw.count(b"{") + raw.count(b"[") > max_containers:
        raise _too_many(max_containers)
    try:
        value = json.loads(raw)
    except RecursionError:
        raise _too_deep(max_depth) from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ApiError.invalid(
            "We could not parse the JSON body of your request: send valid UTF-8 JSON"
        ) from None
    _check_shape(value, max_depth=max_depth, max_containers=max_containers)
    return value


def _too_many(max_containers: int) -> ApiError:
    return ApiError.invalid(
        f"the JSON body holds more than {max_containers} objects and arrays "
        "('{' and '[', strings included)"
    )


def _too_deep(max_depth: int) -> ApiError:
    return ApiError.invalid(f"the JSON body nests deeper than {max_depth} levels")


def _check_shape(value: object, *, max_depth: int, max_containers: int) -> None:
    """Walk the tree without recursion, stopping at the first bound crossed."""
    pending: list[tuple[object, int]] = [(value, 1)]
    containers = 0
    while pending:
        node, depth = pending.pop()
        if isinstance(node, dict):
            children: list[object] = list(node.values())
        elif isinstance(node, list):
            children = node
        else:
            continue
        containers += 1
        if containers > max_containers:
            raise _too_many(max_containers)
        if depth > max_depth:
            raise _too_deep(max_depth)
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
