"""Field readers that turn a decoded wire map into typed values.

Every failure raises :class:`ValidationError` naming the field by its path
(``protocols[2][0]``), which the server sends back as a 400's ``message``.
Unknown extra fields are ignored (docs/protocol.md, "Transport": forward
compatibility).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from typing import Any

from protocol.limits import MAX_NAME_LENGTH, MAX_REASON_LENGTH

Scalar = None | bool | int | float | str | bytes

_MISSING = object()


class ValidationError(ValueError):
    """A request (or response) does not match its schema."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def _type_name(value: object) -> str:
    if value is None:
        return "nil"
    return {bool: "bool", int: "int", float: "float", str: "str", bytes: "bytes",
            list: "list", dict: "map"}.get(type(value), type(value).__name__)


class Fields:
    """A decoded map plus the path it was found at, for error messages."""

    def __init__(self, obj: object, path: str = "") -> None:
        if not isinstance(obj, Mapping):
            raise ValidationError(path or "body", f"expected a map, got {_type_name(obj)}")
        self._obj: Mapping[Any, Any] = obj
        self._path = path

    def name(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def _get(self, key: str, required: bool) -> Any:
        value = self._obj.get(key, _MISSING)
        if value is _MISSING:
            if required:
                raise ValidationError(self.name(key), "missing field")
            return None
        return value

    def string(self, key: str, *, required: bool = True, allow_empty: bool = False,
               max_len: int = MAX_NAME_LENGTH, nullable: bool = False) -> str:
        value = self._get(key, required)
        if value is None and not required:
            return ""
        return check_string(value, self.name(key), allow_empty=allow_empty, max_len=max_len,
                            nullable=nullable) or ""

    def opt_string(self, key: str, *, max_len: int = MAX_NAME_LENGTH) -> str | None:
        value = self._get(key, False)
        if value is None:
            return None
        return check_string(value, self.name(key), max_len=max_len)

    def reason(self, key: str = "reason") -> str | None:
        """Free text for logs: any length accepted, kept up to a bound."""
        value = self._get(key, False)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValidationError(self.name(key), f"expected a string, got {_type_name(value)}")
        value = value[:MAX_REASON_LENGTH]
        # Kept in the rebalance journal: text every store can hold (PostgreSQL's
        # text has no NUL).
        problem = text_problem(value) or ("must not contain NUL (U+0000)" if "\x00" in value
                                          else None)
        if problem is not None:
            raise ValidationError(self.name(key), problem)
        return value

    def integer(self, key: str, *, lo: int, hi: int, required: bool = True,
                default: int = 0) -> int:
        value = self._get(key, required)
        if value is None and not required:
            return default
        return check_int(value, self.name(key), lo=lo, hi=hi)

    def flag(self, key: str) -> bool:
        """An optional boolean, ``False`` when absent or nil."""
        value = self._get(key, False)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise ValidationError(self.name(key),
                                  f"expected true or false, got {_type_name(value)}")
        return value

    def binary(self, key: str, *, required: bool = True) -> bytes:
        value = self._get(key, required)
        if value is None and not required:
            return b""
        if not isinstance(value, bytes):
            raise ValidationError(self.name(key), f"expected bytes, got {_type_name(value)}")
        return value

    def items(self, key: str, *, required: bool = True, max_items: int | None = None,
              nullable: bool = False) -> list[Any] | None:
        value = self._get(key, required)
        if value is None:
            if nullable or not required:
                return None
            raise ValidationError(self.name(key), "expected a list, got nil")
        if not isinstance(value, list):
            raise ValidationError(self.name(key), f"expected a list, got {_type_name(value)}")
        if max_items is not None and len(value) > max_items:
            raise ValidationError(self.name(key), f"at most {max_items} entries, got {len(value)}")
        return value

    def raw(self, key: str) -> Any:
        """An optional field as decoded, unchecked (``None`` when absent)."""
        return self._get(key, False)

    def error(self, key: str = "error") -> Any:
        return self._get(key, False)


#: Unicode categories never accepted in an id or a name: controls (``Cc``: NUL to
#: US, DEL and C1, hence CR, LF and the ESC of ANSI sequences), format controls
#: (``Cf``: the bidi embeddings, overrides and isolates U+202A-U+202E and
#: U+2066-U+2069, the marks U+200E/U+200F, zero-width characters), line and
#: paragraph separators (``Zl``, ``Zp``) and surrogates (``Cs``). Ids end up in
#: log lines, metrics and the admin API; any of these could forge or hide text there.
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def control_character_problem(value: str) -> str | None:
    """What is wrong with ``value`` as an id or name, as far as its characters go
    (``None``: nothing). The one check behind every id and name field."""
    # isprintable() (C speed) is False for every refused category, and for a few
    # accepted ones (other spaces, private use, unassigned): only then look closer.
    if value.isprintable():
        return None
    for position, char in enumerate(value):
        if unicodedata.category(char) in REFUSED_CATEGORIES:
            return (f"must not contain control or format characters (U+{ord(char):04X} "
                    f"at position {position})")
    return None


def check_name(value: str, field: str) -> str:
    """Refuse (:class:`ValidationError` naming ``field``) an id or name holding a
    control or format character; return it unchanged otherwise."""
    problem = control_character_problem(value)
    if problem is not None:
        raise ValidationError(field, problem)
    return value


def check_string(value: object, field: str, *, allow_empty: bool = False,
                 max_len: int = MAX_NAME_LENGTH, nullable: bool = False) -> str | None:
    """An id or name: a string of at most ``max_len`` characters, none of them a
    control or format character (:func:`check_name`)."""
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise ValidationError(field, f"expected a string, got {_type_name(value)}")
    if not value and not allow_empty:
        raise ValidationError(field, "must not be empty")
    if len(value) > max_len:
        raise ValidationError(field, f"longer than {max_len} characters ({len(value)})")
    return check_name(value, field)


def check_int(value: object, field: str, *, lo: int, hi: int) -> int:
    # bool is an int subclass in Python, but never a valid integer on the wire.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, f"expected an integer, got {_type_name(value)}")
    if value < lo:
        raise ValidationError(field, f"must be >= {lo}, got {value}")
    if value > hi:
        raise ValidationError(field, f"must be <= {hi}, got {value}")
    return value


#: The integers a checkpoint value may be: msgpack's range (int64 and uint64), which
#: every store holds (values are stored msgpack-encoded).
MIN_VALUE_INT = -(2**63)
MAX_VALUE_INT = 2**64 - 1


def value_problem(value: object) -> str | None:
    """What keeps ``value`` from being a checkpoint value (``None``: nothing).

    The one definition of what a call may store, shared by both encodings (a
    msgpack and a JSON commit), the admin reset (its results too) and the storage
    codec: nil, a bool, an integer in ``MIN_VALUE_INT..MAX_VALUE_INT``, a finite
    float (NaN and the infinities have no JSON spelling), a string that is
    Unicode text (no lone surrogate: it has no UTF-8 encoding), or bytes.
    """
    kind = type(value)
    if value is None or kind is bool or kind is bytes:
        return None
    if kind is int:
        if MIN_VALUE_INT <= value <= MAX_VALUE_INT:  # type: ignore[operator]
            return None
        return (f"integer {value} is outside the storable range "
                f"{MIN_VALUE_INT}..{MAX_VALUE_INT}")
    if kind is str:
        return text_problem(value)  # type: ignore[arg-type]
    if kind is float:
        return None if math.isfinite(value) else (  # type: ignore[arg-type]
            f"{value} is not a finite number (NaN and infinities cannot be stored)")
    return f"expected a scalar or bytes, got {_type_name(value)}"


def text_problem(text: str) -> str | None:
    """A string that has no UTF-8 encoding (a lone surrogate, as JSON's ``\\ud800``
    escape makes) cannot be stored, logged or sent back: what is wrong, or ``None``."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"not valid Unicode text: a lone surrogate U+{ord(text[exc.start]):04X} "
                f"at position {exc.start}")
    return None


def check_value(value: object, field: str) -> Scalar:
    """A checkpoint value (:func:`value_problem`), or :class:`ValidationError` naming
    ``field``."""
    problem = value_problem(value)
    if problem is not None:
        raise ValidationError(field, problem)
    return value  # type: ignore[return-value]


def check_pair(value: object, field: str, size: int) -> list[Any]:
    if not isinstance(value, list) or len(value) != size:
        raise ValidationError(field, f"expected a list of {size} items")
    return value


def value_size(value: Scalar) -> int:
    """The bytes a checkpoint value counts for: a string's UTF-8, a byte string's
    length, 8 for a number, a bool or nil."""
    kind = type(value)
    if kind is bytes:
        return len(value)  # type: ignore[arg-type]
    if kind is str:
        text: str = value  # type: ignore[assignment]
        return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return 8


def checkpoint_size(resource_set: str, value: Scalar) -> int:
    """The bytes one stored checkpoint counts for against its group's byte cap:
    its set name, 8 for the index, and :func:`value_size`."""
    name = len(resource_set) if resource_set.isascii() else len(resource_set.encode("utf-8"))
    kind = type(value)
    if kind is int or kind is float or kind is bool:
        return name + 16
    return name + 8 + value_size(value)
