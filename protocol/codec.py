"""msgpack encoding of protocol bodies.

Byte fields travel as msgpack ``bin`` and strings as ``str`` (``use_bin_type``),
so a decoder never has to guess which is which. Decoding refuses anything that
is not a well-formed, reasonably shaped document with one clear error type.
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack

from protocol.limits import MAX_NESTING_DEPTH

CONTENT_TYPE = "application/msgpack"


class DecodeError(ValueError):
    """The body is not a msgpack document this protocol can read."""


# One Packer per thread, reused: msgpack.packb builds a new Packer (and its
# buffer) on every call, which cost more than packing a heartbeat's answer.
# A Packer is not safe to share between threads; after a failed pack it resets.
_local = threading.local()


def encode(obj: Any) -> bytes:
    """Encode a wire document (maps, lists, str, bytes, ints, floats, None)."""
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    data: bytes = packer.pack(obj)
    return data


def decode(data: bytes) -> Any:
    """Decode one msgpack document, refusing trailing bytes and deep nesting."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
    except msgpack.ExtraData as exc:
        raise DecodeError("body has trailing bytes after the msgpack document") from exc
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        # Truncated data, invalid UTF-8 in a str, unhashable map keys, ...
        raise DecodeError(f"body is not valid msgpack: {exc}") from exc
    _check_depth(obj)
    return obj


_CONTAINERS = (dict, list)


def _check_depth(obj: Any) -> None:
    # Only containers are visited; a container found at a depth over the limit
    # is refused. A map of scalars (every heartbeat) is one pass over its values.
    if type(obj) is dict:
        for value in obj.values():
            if isinstance(value, _CONTAINERS):
                break
        else:
            return
    elif not isinstance(obj, _CONTAINERS):
        return
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_NESTING_DEPTH:
            raise DecodeError(f"body nests deeper than {MAX_NESTING_DEPTH} levels")
        for value in (item.values() if isinstance(item, dict) else item):
            if isinstance(value, _CONTAINERS):
                stack.append((value, depth + 1))
