"""JSON bodies for the protocol calls (docs/protocol.md, "JSON on the protocol calls").

A call sent with ``Content-Type: application/json`` is answered in JSON, so
``curl`` and any language without a msgpack library can be a member. The
documents are the msgpack ones, with the byte fields carried as base64
(standard alphabet, padded):

* ``metadata`` of a join's protocols (``[name, metadata]``) and of the join
  answer's members, ``assignment`` of a sync's assignments and of its answer:
  a base64 string (these fields are always bytes);
* a checkpoint value (commit ``[set, index, value]``, fetch answers) may be a
  string *or* bytes, so bytes are an object ``{"base64": "..."}`` there; a
  plain JSON string is a string value.

This module only maps JSON to the wire documents the message classes already
validate (``from_wire``) and back; every rule about fields stays in
:mod:`protocol.messages`. msgpack stays the default and the fast path.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from protocol.codec import DecodeError
from protocol.limits import MAX_NESTING_DEPTH
from protocol.validate import ValidationError

CONTENT_TYPE = "application/json"


def _bytes(value: object, field: str) -> object:
    """A base64 string as bytes; anything else is left for ``from_wire`` to refuse."""
    if not isinstance(value, str):
        return value
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(field, "not valid base64 (standard alphabet, padded)") from None


def _value(value: object, field: str) -> object:
    """A checkpoint value: ``{"base64": s}`` is bytes, any other JSON scalar is itself."""
    if isinstance(value, dict):
        if set(value) != {"base64"}:
            raise ValidationError(field, 'bytes are {"base64": "..."}; other objects are '
                                         "not checkpoint values")
        decoded = _bytes(value["base64"], f"{field}.base64")
        if not isinstance(decoded, bytes):
            raise ValidationError(f"{field}.base64", "expected a base64 string")
        return decoded
    return value


def _each(doc: dict[str, Any], key: str) -> list[Any]:
    items = doc.get(key)
    return items if isinstance(items, list) else []


def decode_request(api: str, body: bytes) -> Any:
    """The wire document of a JSON request body (bytes fields decoded).

    Raises :class:`DecodeError` for a body that is not JSON and
    :class:`ValidationError` for a byte field that is not base64; the shape of
    the document is checked later by the message's ``from_wire``.
    """
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise DecodeError(f"body nests deeper than {MAX_NESTING_DEPTH} levels") from None
    if not isinstance(doc, dict):
        return doc  # from_wire names the problem ("expected a map")
    if api == "join":
        for i, protocol in enumerate(_each(doc, "protocols")):
            if isinstance(protocol, list) and len(protocol) == 2:
                protocol[1] = _bytes(protocol[1], f"protocols[{i}][1]")
    elif api == "sync":
        for i, item in enumerate(_each(doc, "assignments")):
            if isinstance(item, dict) and "assignment" in item:
                item["assignment"] = _bytes(item["assignment"], f"assignments[{i}].assignment")
    elif api == "commit":
        for i, checkpoint in enumerate(_each(doc, "checkpoints")):
            if isinstance(checkpoint, list) and len(checkpoint) == 3:
                checkpoint[2] = _value(checkpoint[2], f"checkpoints[{i}][2]")
    return doc


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _out_value(value: object) -> object:
    return {"base64": _b64(value)} if isinstance(value, bytes) else value


def encode_response(api: str, doc: dict[str, Any]) -> bytes:
    """The JSON body of an answer's wire document (bytes as base64)."""
    if api == "join":
        doc = {**doc, "members": [{**m, "metadata": _b64(m["metadata"])}
                                  for m in doc.get("members") or ()]}
    elif api == "sync" and isinstance(doc.get("assignment"), bytes):
        doc = {**doc, "assignment": _b64(doc["assignment"])}
    elif api == "fetch":
        doc = {**doc, "checkpoints": [[s, i, _out_value(v)]
                                      for s, i, v in doc.get("checkpoints") or ()]}
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def encode_error(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")
