"""What the console's pages show, as plain values for the templates.

Everything comes from :mod:`coordinator.admin_views` (the admin API's
documents) and :mod:`coordinator.history` (the journal's reading): the
console adds only layout decisions (the assignment grid, bounds on what one
page holds) and a cache of journal rows, so that refreshing a page every
half second for its live updates does not read the database each time.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator import admin_views, auth, history
from coordinator.console.live import ROW_COST, Pace
from coordinator.runtime.service import Service
from protocol.admin_docs import RebalanceSummary, shows_placement
from protocol.catalog import DEFAULT_PLACEMENT, Placement, Summary, ZoneList
from protocol.resources import PROTOCOL_TYPE as RESOURCES

#: most groups the overview lists (the admin API's ?state= filter finds the rest).
MAX_OVERVIEW_GROUPS = 500
#: most rebalances a group page's timeline shows.
TIMELINE_LENGTH = 20
#: the assignment grid is drawn up to this many resources (rows) ...
MAX_GRID_ROWS = 1024
#: ... and members (columns); larger groups get the members table's counts only.
MAX_GRID_MEMBERS = 40
#: most checkpoints a group page lists.
MAX_CHECKPOINTS = 1000
#: a journal read is reused this long while the group's generation is unchanged
#: and the newest row is of an older generation (the row is written after the
#: generation forms).
JOURNAL_RETRY_S = 1.0
#: a journal read is reused at most this long in any case.
JOURNAL_MAX_AGE_S = 30.0
#: groups whose journal rows are cached at most.
MAX_CACHED_GROUPS = 4096


@dataclass(slots=True)
class _Cached:
    generation_id: int
    limit: int
    rows: list[dict[str, Any]]
    read_at: float
    #: the newest rebalance summarized (:meth:`JournalCache.last_rebalance`), once.
    last: RebalanceSummary | None = None
    #: the rows summarized (:meth:`JournalCache.timeline`), once per length asked.
    timelines: dict[int, list[RebalanceSummary]] = field(default_factory=dict)


class JournalCache:
    """The newest journal rows of groups, read again only when they may have changed.

    A new row appears when a rebalance completes, so the rows are current as
    long as the group's generation is the one of the newest row.
    """

    def __init__(self, runtime: Service, *, clock: Any = time.monotonic) -> None:
        self._runtime = runtime
        self._clock = clock
        self._by_group: OrderedDict[str, _Cached] = OrderedDict()

    async def rows(self, group_id: str, generation_id: int, limit: int
                   ) -> list[dict[str, Any]]:
        """Up to ``limit`` newest rows of the group, newest first."""
        return (await self._entry(group_id, generation_id, limit)).rows[:limit]

    async def last_rebalance(self, group_id: str, generation_id: int
                             ) -> RebalanceSummary | None:
        """The group's newest rebalance as :func:`coordinator.history.summarize` tells
        it, summarized once per journal read; ``None``: none recorded."""
        if generation_id <= 0:
            return None
        cached = await self._entry(group_id, generation_id, 2)
        if cached.last is None and cached.rows:
            cached.last = history.summarize(cached.rows[:2], 1)[0]
        return cached.last

    async def timeline(self, group_id: str, generation_id: int, limit: int
                       ) -> list[RebalanceSummary]:
        """The group's newest ``limit`` rebalances as :func:`coordinator.history.summarize`
        tells them, summarized once per journal read (a live page asks every half
        second; summarizing decodes every assignment of every row read)."""
        if generation_id <= 0:
            return []
        cached = await self._entry(group_id, generation_id, limit + 1)
        timeline = cached.timelines.get(limit)
        if timeline is None:
            timeline = cached.timelines[limit] = history.summarize(cached.rows[:limit + 1],
                                                                   limit)
        return timeline

    async def _entry(self, group_id: str, generation_id: int, limit: int) -> _Cached:
        now = self._clock()
        cached = self._by_group.get(group_id)
        if cached is not None and cached.limit >= limit and cached.generation_id == generation_id:
            newest = cached.rows[0]["generation_id"] if cached.rows else None
            fresh = newest == generation_id or now - cached.read_at < JOURNAL_RETRY_S
            if fresh and now - cached.read_at < JOURNAL_MAX_AGE_S:
                self._by_group.move_to_end(group_id)
                return cached
        rows = await self._runtime.storage.rebalances(group_id, limit)
        cached = self._by_group[group_id] = _Cached(generation_id, limit, rows, now)
        self._by_group.move_to_end(group_id)
        while len(self._by_group) > MAX_CACHED_GROUPS:
            self._by_group.popitem(last=False)
        return cached


# ---------------------------------------------------------------- overview


@dataclass(frozen=True, slots=True)
class CatalogRow:
    """One resource set of the catalog: its size, weights and zones in short."""

    name: str
    partitions: int
    summary: Summary


def catalog_rows(runtime: Service, names: set[str] | None = None) -> list[CatalogRow]:
    """The catalog's sets (those of ``names`` only, when given), by name."""
    core = runtime.core
    placement = core.catalog_placement()
    return [CatalogRow(name, partitions,
                       Summary.of(partitions, placement.get(name, DEFAULT_PLACEMENT)))
            for name, partitions in sorted(core.catalog().items())
            if names is None or name in names]


@dataclass(slots=True)
class Overview:
    groups: list[dict[str, Any]]
    #: granted groups in all (``groups`` holds the first MAX_OVERVIEW_GROUPS).
    total: int
    #: a "health" column: only when the group documents carry one.
    has_health: bool
    #: the resource catalog (every group's leader assigns from it).
    catalog: list[CatalogRow] = field(default_factory=list)


async def overview(runtime: Service, journal: JournalCache, group_ids: Sequence[str],
                   entry: auth.TokenEntry | None, now_ms: int, pace: Pace) -> Overview:
    """The groups of ``group_ids`` (``runtime.core.group_ids()``, read after
    ``runtime.refresh_groups()``) that ``entry`` is granted
    (:func:`coordinator.auth.authorize`): how many, and the first
    MAX_OVERVIEW_GROUPS as ``GET /v1/groups`` lists them
    (:func:`coordinator.admin_views.group_row`, health at ``now_ms``) with their
    last rebalance and why. Only the groups shown are read."""
    core = runtime.core
    shown: list[dict[str, Any]] = []
    total = 0
    for group_id in group_ids:
        await pace.step()
        if not auth.authorize(entry, group_id):
            continue
        total += 1
        if len(shown) >= MAX_OVERVIEW_GROUPS:
            continue
        summary = core.group_summary(group_id)
        if summary is None:  # deleted while this list was read
            total -= 1
            continue
        group = admin_views.group_row(core, summary, now_ms)
        # The table shows the health, not why: the reasons' wording counts seconds,
        # and would change the row (so render it again) every second.
        del group["health_reasons"]
        group["last_rebalance"] = await journal.last_rebalance(group_id,
                                                               summary.generation_id)
        shown.append(group)
        await pace.step(ROW_COST)
    return Overview(shown, total, any("health" in g for g in shown),
                    catalog_rows(runtime))


# ---------------------------------------------------------------- one group


@dataclass(slots=True)
class GridRow:
    resource_set: str
    index: int
    #: column index of the owner, ``None`` when nobody owns it.
    owner: int | None
    #: the owner changed in the newest rebalance (this generation).
    moved: bool
    #: who owned it before that rebalance (``None``: nobody).
    moved_from: str | None
    #: its weight in the catalog, when its set has weights other than the default.
    weight: float | None = None
    #: its home zones in the catalog, when its set has zones (``None``: anywhere).
    zones: ZoneList = None


@dataclass(slots=True)
class Grid:
    #: one per member: its label (client id, and instance id when static).
    columns: list[str]
    rows: list[GridRow]
    #: resources in all (``rows`` holds the first MAX_GRID_ROWS).
    total: int
    #: the generation whose moves are marked; ``None`` when not known yet.
    moves_of: int | None
    moved_count: int
    #: the group's sets as the catalog has them (size, weights and zones in short).
    sets: list[CatalogRow] = field(default_factory=list)


@dataclass(slots=True)
class GroupPage:
    group: dict[str, Any]
    grid: Grid | None
    #: why there is no grid (another protocol, too many members), else "".
    no_grid: str
    checkpoints: list[dict[str, Any]]
    checkpoint_total: int
    timeline: list[RebalanceSummary]
    now_ms: int = field(default=0)
    #: the members table has placement columns (rack, capacity, load, standby,
    #: warm, draining or drain requested): some member of a "resources" group
    #: reported or was given one, or was asked to drain.
    placement: bool = False


def member_label(member: dict[str, Any]) -> str:
    label = str(member["client_id"] or member["member_id"])
    if member.get("group_instance_id"):
        label += f" ({member['group_instance_id']})"
    return label


def _identity(member: dict[str, Any]) -> str:
    # As coordinator.history.owners names owners: the instance id, else the member id.
    return str(member.get("group_instance_id") or member["member_id"])


def assignment_grid(group: dict[str, Any], catalog: dict[str, int],
                    journal_rows: list[dict[str, Any]],
                    placement: Mapping[str, Placement] | None = None) -> Grid | None:
    """Resources (rows) by members (columns) of a "resources" group, with the moves
    of its newest rebalance marked, and each resource's weight and zones when its
    set in the catalog has them (``placement``); ``None`` for other protocols."""
    if group["protocol_type"] != RESOURCES:
        return None
    members = group["members"]
    owner_of: dict[tuple[str, int], int] = {}
    sets: set[str] = set()
    for n, member in enumerate(members):
        assignment = member["assignment"]
        if not isinstance(assignment, dict):
            return None  # bytes that are not a resources map (the admin API shows base64)
        for name, indexes in assignment.items():
            sets.add(name)
            for index in indexes:
                owner_of[(name, index)] = n
    resources: set[tuple[str, int]] = set(owner_of)
    for name in sets:
        resources.update((name, i) for i in range(catalog.get(name, 0)))
    before: dict[tuple[str, int], str] = {}
    after: dict[tuple[str, int], str] | None = None
    moves_of = None
    if journal_rows and journal_rows[0]["generation_id"] == group["generation_id"]:
        after = history.owners(journal_rows[0])
        if after is not None and len(journal_rows) > 1:
            before = history.owners(journal_rows[1]) or {}
        moves_of = group["generation_id"] if after is not None else None
    label_of = {_identity(m): member_label(m) for m in members}
    ordered = sorted(resources)
    rows: list[GridRow] = []
    moved_count = 0
    placed = {name: p for name, p in (placement or {}).items() if name in sets}
    weights = {name: p.weights.as_dict() for name, p in placed.items()
               if not p.weights.is_default}
    zones = {name: p.zones.as_dict() for name, p in placed.items() if not p.zones.is_default}
    for resource in ordered:
        column = owner_of.get(resource)
        moved = False
        moved_from = None
        if after is not None and column is not None:
            who = after.get(resource)
            previous = before.get(resource)
            if who is not None and who == _identity(members[column]) and previous != who:
                moved = True
                moved_count += 1
                moved_from = None if previous is None else label_of.get(previous, previous)
        if len(rows) < MAX_GRID_ROWS:
            name, index = resource
            row = GridRow(name, index, column, moved, moved_from)
            if name in weights:
                row.weight = weights[name].get(index, placed[name].weights.default)
            if name in zones:
                row.zones = zones[name].get(index, placed[name].zones.default)
            rows.append(row)
    return Grid([member_label(m) for m in members], rows, len(ordered), moves_of, moved_count,
                [CatalogRow(name, catalog[name],
                            Summary.of(catalog[name], placed.get(name, DEFAULT_PLACEMENT)))
                 for name in sorted(sets) if name in catalog])


async def group_page(runtime: Service, journal: JournalCache, group_id: str
                     ) -> GroupPage | None:
    """The group page's content; ``None`` when the group does not exist."""
    view = runtime.core.describe_group(group_id)
    if view is None:
        return None
    group = admin_views.group_doc(view)
    group["coordinator"] = admin_views.coordinator_doc(runtime, group_id)
    rows = (await journal.rows(group_id, view.generation_id, TIMELINE_LENGTH + 1)
            if view.generation_id > 0 else [])
    grid = None
    no_grid = ""
    if len(group["members"]) > MAX_GRID_MEMBERS:
        no_grid = (f"The grid is drawn for up to {MAX_GRID_MEMBERS} members; this group has "
                   f"{len(group['members'])}. The members table counts what each owns.")
    elif group["members"]:
        grid = assignment_grid(group, dict(runtime.core.catalog()), rows,
                               runtime.core.catalog_placement())
        if grid is None:
            no_grid = (f"Assignments of the {group['protocol_type']!r} protocol are opaque "
                       "bytes to the coordinator; the grid is drawn for \"resources\" groups.")
    checkpoints = admin_views.checkpoints_doc(runtime, group_id)
    for member in group["members"]:
        assignment = member["assignment"]
        member["owned"] = (sum(len(v) for v in assignment.values())
                           if isinstance(assignment, dict) else None)
        member["standby_count"] = sum(len(v) for v in member.get("standby", {}).values())
        member["warm_count"] = sum(len(v) for v in member.get("warm", {}).values())
    return GroupPage(group=group, grid=grid, no_grid=no_grid,
                     checkpoints=checkpoints[:MAX_CHECKPOINTS],
                     checkpoint_total=len(checkpoints),
                     timeline=await journal.timeline(group_id, view.generation_id,
                                                     TIMELINE_LENGTH),
                     now_ms=int(time.time() * 1000),
                     placement=any(shows_placement(m) for m in group["members"]))
