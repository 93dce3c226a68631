"""The catalog's weights and home zones (docs/protocol.md, v1.2, "Resources that differ").

A resource set of the catalog has ``partitions`` resources and, optionally, a
:class:`Placement`: the load each resource is expected to carry
(:class:`Weights`) and the zones it is best served from (:class:`Zones`). Both
are sparse (a default plus overrides by index), so a set of a million
resources with a few hot ones remains a small value.

One JSON shape for both the admin API and the stores::

    "weights": {"default": 1.0, "overrides": [[3, 40.0], [7, 12.5]]}
    "zones":   {"default": null, "overrides": [[3, ["eu-1a"]], [4, ["eu-1a", "eu-1b"]]]}

:func:`parse_weights` and :func:`parse_zones` check a decoded value and name the
field of the first problem (``weights.overrides[3][1]: ...``); the stores read
their columns back through them too. :func:`put_placement` is what a
``PUT /v1/resources/{name}`` makes of the set's current placement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from protocol.limits import MAX_PARTITIONS
from protocol.validate import ValidationError, check_int, check_string

#: overrides one set may hold, in ``weights`` and in ``zones`` each.
MAX_OVERRIDES = 100_000
#: zones one resource may name.
MAX_ZONES = 32
#: the largest weight: a set's total expected load stays a finite number.
MAX_WEIGHT = 1e15

#: one resource's home zones; ``None``: anywhere.
ZoneList = tuple[str, ...] | None


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


@dataclass(frozen=True, slots=True)
class Weights:
    """The load each resource of a set is expected to carry: ``default`` for every
    resource but those of ``overrides`` (``(index, weight)``, by increasing index)."""

    default: float = 1.0
    overrides: tuple[tuple[int, float], ...] = ()

    @property
    def is_default(self) -> bool:
        return self.default == 1.0 and not self.overrides

    def as_dict(self) -> dict[int, float]:
        """The overrides, index -> weight."""
        return dict(self.overrides)

    def total(self, partitions: int) -> float:
        """The expected load of the whole set of ``partitions`` resources."""
        inside = [w for i, w in self.overrides if i < partitions]
        return math.fsum(inside) + self.default * (partitions - len(inside))

    def to_json(self) -> dict[str, Any]:
        return {"default": self.default, "overrides": [[i, w] for i, w in self.overrides]}


@dataclass(frozen=True, slots=True)
class Zones:
    """Where each resource of a set is best served: ``default`` for every resource
    but those of ``overrides`` (``(index, zones)``, by increasing index); ``None``
    means anywhere."""

    default: ZoneList = None
    overrides: tuple[tuple[int, ZoneList], ...] = ()

    @property
    def is_default(self) -> bool:
        return self.default is None and not self.overrides

    def as_dict(self) -> dict[int, ZoneList]:
        """The overrides, index -> zones."""
        return dict(self.overrides)

    def names(self) -> list[str]:
        """Every zone named, default first, each once."""
        seen: dict[str, None] = dict.fromkeys(self.default or ())
        for _, zones in self.overrides:
            seen.update(dict.fromkeys(zones or ()))
        return list(seen)

    def to_json(self) -> dict[str, Any]:
        return {"default": None if self.default is None else list(self.default),
                "overrides": [[i, None if z is None else list(z)] for i, z in self.overrides]}


@dataclass(frozen=True, slots=True)
class Placement:
    """A set's weights and zones; the default (``Placement()``) is every resource
    weighing 1.0, anywhere."""

    weights: Weights = Weights()
    zones: Zones = Zones()

    @property
    def is_default(self) -> bool:
        return self.weights.is_default and self.zones.is_default

    def beyond(self, partitions: int) -> tuple[str, int] | None:
        """The first override outside ``0..partitions - 1``, as ``(field, index)``;
        ``None`` when every override is inside."""
        for field, overrides in (("weights", self.weights.overrides),
                                 ("zones", self.zones.overrides)):
            if overrides and overrides[-1][0] >= partitions:
                return field, next(i for i, _ in overrides if i >= partitions)
        return None


DEFAULT_PLACEMENT = Placement()


def _overrides(value: object, field: str, partitions: int | None) -> list[tuple[int, Any, int]]:
    """``[[index, x], ...]`` checked as far as the indexes go: ``(index, x, position)``,
    by index. Tens of thousands of overrides are read on the server's event loop,
    so the common case takes a fast path; the checks that name a problem run
    only once one is found."""
    if not isinstance(value, list):
        raise ValidationError(field, f"expected a list of [index, value] pairs, got "
                                     f"{_kind(value)}")
    if len(value) > MAX_OVERRIDES:
        raise ValidationError(field, f"at most {MAX_OVERRIDES} overrides, got {len(value)}")
    limit = MAX_PARTITIONS if partitions is None else partitions
    out: list[tuple[int, Any, int]] = []
    seen: set[int] = set()
    for n, pair in enumerate(value):
        if type(pair) is list and len(pair) == 2:
            index = pair[0]
            if type(index) is int and 0 <= index < limit and index not in seen:
                seen.add(index)
                out.append((index, pair[1], n))
                continue
        _refuse_pair(pair, f"{field}[{n}]", partitions, seen)
    out.sort(key=itemgetter(0))
    return out


def _refuse_pair(pair: object, where: str, partitions: int | None, seen: set[int]) -> None:
    """Raise what is wrong with one ``[index, x]`` of :func:`_overrides`."""
    if not isinstance(pair, list) or len(pair) != 2:
        raise ValidationError(where, f"expected an [index, value] pair, got {_kind(pair)}"
                              + (f" of {len(pair)} items" if isinstance(pair, list) else ""))
    index = pair[0]
    hi = MAX_PARTITIONS - 1 if partitions is None else partitions - 1
    if partitions is not None and isinstance(index, int) and not isinstance(index, bool) \
            and index >= partitions:
        raise ValidationError(f"{where}[0]", f"index {index} is beyond the set's "
                                             f"{partitions} partitions (0..{hi})")
    check_int(index, f"{where}[0]", lo=0, hi=hi)
    if index in seen:
        raise ValidationError(f"{where}[0]", f"index {index} is given twice")
    raise AssertionError(f"{where}: refused without a reason")  # pragma: no cover


def _object(value: object, field: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ValidationError(field, f"expected an object with {' and '.join(keys)}, "
                                     f"got {_kind(value)}")
    unknown = sorted(str(k) for k in value if k not in keys)
    if unknown:
        raise ValidationError(f"{field}.{unknown[0]}", f"unknown field (expected "
                                                       f"{' and '.join(keys)})")
    return value


def check_weight(value: object, field: str) -> float:
    """One weight: a finite number in 0..MAX_WEIGHT (an integer is taken as a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value <= MAX_WEIGHT:  # NaN fails the comparison too
        shown = repr(value) if isinstance(value, (int, float)) else _kind(value)
        raise ValidationError(field, f"must be a finite number >= 0 (at most {MAX_WEIGHT:g}), "
                                     f"got {shown}")
    return float(value)


def parse_weights(value: object, field: str = "weights",
                  partitions: int | None = None) -> Weights:
    """``{"default": W, "overrides": [[index, w], ...]}`` (both optional) checked; an
    index must be below ``partitions`` when given."""
    doc = _object(value, field, ("default", "overrides"))
    default = check_weight(doc.get("default", 1.0), f"{field}.default")
    pairs = _overrides(doc.get("overrides", []), f"{field}.overrides", partitions)
    return Weights(default, tuple(
        (i, w if type(w) is float and 0.0 <= w <= MAX_WEIGHT
         else check_weight(w, f"{field}.overrides[{n}][1]")) for i, w, n in pairs))


def _zone_list(value: object, at: tuple[str, int | None],
               known: dict[tuple[str, ...], tuple[str, ...]]) -> ZoneList:
    """One resource's zones (``at``: the field, ``(zones, None)`` for the default,
    ``(zones, n)`` for the n-th override); ``known`` holds the lists already
    checked (many resources share a few: each is checked once, kept as one tuple)."""
    if value is None:
        return None
    if type(value) is list:
        try:
            hit = known.get(tuple(value))
        except TypeError:  # an unhashable item: refused below
            hit = None
        if hit is not None:
            return hit
    field = f"{at[0]}.default" if at[1] is None else f"{at[0]}.overrides[{at[1]}][1]"
    if not isinstance(value, list) or not value:
        raise ValidationError(field, f"expected null (anywhere) or a non-empty list of zone "
                                       f"names, got {_kind(value) if value != [] else '[]'}")
    if len(value) > MAX_ZONES:
        raise ValidationError(field, f"at most {MAX_ZONES} zones, got {len(value)}")
    names: list[str] = []
    for n, name in enumerate(value):
        checked = check_string(name, f"{field}[{n}]")
        assert checked is not None
        if checked in names:
            raise ValidationError(f"{field}[{n}]", f"zone {checked!r} is given twice")
        names.append(checked)
    zones = tuple(names)
    known[zones] = zones
    return zones


def parse_zones(value: object, field: str = "zones", partitions: int | None = None) -> Zones:
    """``{"default": null | [zone, ...], "overrides": [[index, null | [zone, ...]], ...]}``
    (both optional) checked; zone names as other names; an index below ``partitions``
    when given."""
    doc = _object(value, field, ("default", "overrides"))
    known: dict[tuple[str, ...], tuple[str, ...]] = {}
    default = _zone_list(doc.get("default"), (field, None), known)
    pairs = _overrides(doc.get("overrides", []), f"{field}.overrides", partitions)
    return Zones(default, tuple(
        (i, _zone_list(z, (field, n), known))
        for i, z, n in pairs))


def put_placement(current: Placement, partitions: int, weights: Weights | None,
                  zones: Zones | None) -> Placement:
    """The placement a set has after a ``PUT`` of ``partitions`` with ``weights`` and
    ``zones`` (``None``: not given, the set keeps what it has). A kept override
    beyond the new size is refused (:class:`ValidationError` naming the field),
    never silently dropped."""
    placement = Placement(current.weights if weights is None else weights,
                          current.zones if zones is None else zones)
    outside = placement.beyond(partitions)
    if outside is not None:
        field, index = outside
        raise ValidationError(f"{field}.overrides", f"the set has an override for index "
                                                    f"{index}, beyond the new {partitions} "
                                                    f"partitions: send {field} without it")
    return placement


def catalog_json(catalog: Mapping[str, int], placement: Mapping[str, Placement],
                 resources_epoch: int) -> dict[str, Any]:
    """The body of ``GET /v1/resources``: the counts under ``resources`` (as in v1),
    and ``weights`` and ``zones``, each a map from set name holding only the sets
    whose weights (zones) are not the default, and absent when it would be empty
    (a catalog of counts only is answered as v1 answered it)."""
    named = sorted(placement.items())
    doc: dict[str, Any] = {"resources_epoch": resources_epoch, "resources": dict(catalog)}
    weights = {n: p.weights.to_json() for n, p in named if not p.weights.is_default}
    zones = {n: p.zones.to_json() for n, p in named if not p.zones.is_default}
    if weights:
        doc["weights"] = weights
    if zones:
        doc["zones"] = zones
    return doc


def parse_catalog_placement(doc: Mapping[str, Any], resources: Mapping[str, int]
                            ) -> dict[str, Placement]:
    """The placements of a ``GET /v1/resources`` body whose counts are ``resources``
    (absent ``weights`` and ``zones``, as an older coordinator answers: none)."""
    weights = {name: parse_weights(value, f"weights.{name}", resources[name])
               for name, value in _by_set(doc, "weights", resources).items()}
    zones = {name: parse_zones(value, f"zones.{name}", resources[name])
             for name, value in _by_set(doc, "zones", resources).items()}
    out: dict[str, Placement] = {}
    for name in sorted(weights.keys() | zones.keys()):
        placement = Placement(weights.get(name, Weights()), zones.get(name, Zones()))
        if not placement.is_default:
            out[name] = placement
    return out


def _by_set(doc: Mapping[str, Any], key: str, resources: Mapping[str, int]) -> dict[str, Any]:
    raw = doc.get(key, {})
    if not isinstance(raw, dict):
        raise ValidationError(key, f"expected an object of set name -> {key}, got {_kind(raw)}")
    for name in raw:
        if name not in resources:
            raise ValidationError(f"{key}.{name}", "a set that is not in resources")
    return raw


@dataclass(frozen=True, slots=True)
class Summary:
    """A set's weights and zones in a few numbers, as ``groupcoord resources list`` and
    the console show them."""

    default_weight: float
    weight_overrides: int
    #: the set's total expected load (:meth:`Weights.total`).
    expected_load: float
    #: ``None``: anywhere.
    default_zones: ZoneList
    zone_overrides: int
    #: every zone named, default first.
    zones: tuple[str, ...]

    @classmethod
    def of(cls, partitions: int, placement: Placement) -> Summary:
        weights, zones = placement.weights, placement.zones
        return cls(weights.default, len(weights.overrides), weights.total(partitions),
                   zones.default, len(zones.overrides), tuple(zones.names()))

    def weights_text(self) -> str:
        """``default 1, 2 overrides, load 1050.5``."""
        return (f"default {self.default_weight:g}, {_count(self.weight_overrides, 'override')}, "
                f"load {self.expected_load:g}")

    def zones_text(self) -> str:
        """``anywhere`` or ``default eu-1a; 2 overrides (eu-1a, eu-1b)``."""
        if self.default_zones is None and not self.zone_overrides:
            return "anywhere"
        default = "anywhere" if self.default_zones is None else ",".join(self.default_zones)
        text = f"default {default}"
        if self.zone_overrides:
            text += f"; {_count(self.zone_overrides, 'override')} ({', '.join(self.zones)})"
        return text


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")
