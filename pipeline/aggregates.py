"""The aggregates of ``rebalances/``, in Spark SQL (docs/pipeline.md).

``group_hours/``, ``groups/`` and ``fleet_hours/`` and the report's figures
are plain ``groupBy(...).agg(...)`` over the facts Spark wrote; percentiles
are Spark's exact ``percentile`` (linear interpolation between ranks: p95 of
10, 50, 100, 300 is 270).
"""

from __future__ import annotations

from typing import Any

HOUR_MS = 3_600_000

#: Known reasons get a column each (coordinator/core/records.py
#: REBALANCE_REASONS); anything else is counted in ``reason_other``.
REASONS: tuple[str, ...] = (
    "initial", "join", "rejoin", "metadata_change", "leave", "session_expiry", "join_timeout",
    "sync_timeout", "restart", "static_change",
)

SUMMED = ("joined", "left", "revoked", "moved", "unavailable_ms", "unowned_at_end")
PERCENTILES = (0.5, 0.95, 0.99)


def duration_names(prefix: str) -> tuple[str, ...]:
    """The columns of :func:`durations` with ``prefix``: ``<prefix>_p50_ms``
    ... ``<prefix>_max_ms``."""
    return (*(f"{prefix}_p{round(p * 100)}_ms" for p in PERCENTILES), f"{prefix}_max_ms")


DURATIONS = duration_names("duration")

#: The group_hours columns fleet_hours sums, in fleet_hours' order.
FLEET_SUMS: tuple[str, ...] = ("rebalances", *SUMMED, "follow_up_rebalances",
                               *(f"reason_{r}" for r in (*REASONS, "other")))

#: Counted over the facts for the report's totals (not in fleet_hours/).
FACT_COUNTS: tuple[str, ...] = ("assignment_errors", "unreadable", "cooperative_rebalances")


def hour_start() -> Any:
    """The UTC hour a rebalance started in, as epoch ms."""
    from pyspark.sql import functions as F
    return (F.col("started_ms") - F.pmod("started_ms", F.lit(HOUR_MS))).alias("hour_start_ms")


def durations(duration: Any, prefix: str, frequency: Any = None) -> list[Any]:
    """Exact percentiles (PERCENTILES) and the largest of the column
    ``duration`` (nulls left out), named as in :func:`duration_names`;
    ``frequency``: how often each row's value occurred (1 without)."""
    from pyspark.sql import functions as F
    pct = F.percentile(duration, list(PERCENTILES), 1 if frequency is None else frequency)
    names = duration_names(prefix)
    return [*(pct[i].alias(names[i]) for i in range(len(PERCENTILES))),
            F.max(duration).alias(names[-1])]


def _durations() -> list[Any]:
    """Exact duration percentiles and the longest, named as in DURATIONS."""
    from pyspark.sql import functions as F
    return durations(F.col("duration_ms"), "duration")


def _sums(threshold: int, storms: bool = True) -> list[Any]:
    """Per key: rebalances, the ownership sums (a rebalance without figures
    adds 0), follow-ups (null when no rebalance of the key has figures),
    the reasons and (``storms``) the storm rebalances."""
    from pyspark.sql import functions as F
    out = [F.count(F.lit(1)).alias("rebalances")]
    out += [F.coalesce(F.sum(c), F.lit(0)).cast("long").alias(c) for c in SUMMED]
    out.append(F.sum(F.col("is_follow_up").cast("long")).alias("follow_up_rebalances"))
    for r in REASONS:
        out.append(F.sum(F.when(F.col("reason") == r, 1).otherwise(0)).cast("long")
                   .alias(f"reason_{r}"))
    known = F.col("reason").isin(*REASONS)
    out.append(F.sum(F.when(known, 0).otherwise(1)).cast("long").alias("reason_other"))
    if storms:
        out.append(F.sum(F.when(F.col("window_count") >= threshold, 1).otherwise(0))
                   .cast("long").alias("storm_rebalances"))
    return out


def group_hours(rebalances: Any, threshold: int) -> Any:
    """One row per group and UTC hour. ``analyze`` takes these rows from the
    facts task (pipeline/group_figures.py); this is their definition, which
    the tests check that against."""
    return rebalances.groupBy("source", "group_id", hour_start()).agg(
        *_sums(threshold), *_durations())


def groups(rebalances: Any, generations: Any, threshold: int) -> Any:
    """One row per group, with its generations (formed, and formed without
    the leader's assignment). ``analyze`` takes the per-group part from the
    facts task (pipeline/group_figures.py); this is its definition, which
    the tests check that against."""
    from pyspark.sql import functions as F
    per_group = rebalances.groupBy("source", "group_id").agg(
        *_sums(threshold), *_durations(),
        *durations(F.when(~is_initial(), F.col("duration_ms")), "rebalance"),
        F.min("started_ms").alias("first_started_ms"),
        F.max("ended_ms").alias("last_ended_ms"),
        F.max("window_count").alias("peak_window_rebalances"),
        F.max_by("protocol_name", "journal_id").alias("protocol_name"),
        F.bool_or("cooperative").alias("cooperative"),
        F.max("member_count").alias("max_members"),
        F.max("follow_ups").alias("max_follow_ups"))
    return with_generations(per_group, generations)


def with_generations(per_group: Any, generations: Any) -> Any:
    """Per-group rows with their generations joined on (null: none known)."""
    from pyspark.sql import functions as F
    gens = generations.groupBy("source", "group_id").agg(
        F.count(F.lit(1)).alias("generations_formed"),
        F.sum(F.when(F.col("has_assignments"), 0).otherwise(1)).cast("long")
        .alias("generations_without_assignment"))
    return per_group.join(gens, ["source", "group_id"], "left")


def is_initial() -> Any:
    """Whether a row of ``rebalances/`` is an initial join, not a rebalance."""
    from pyspark.sql import functions as F
    return F.coalesce(F.col("reason") == "initial", F.lit(False))


def rebalance_durations(duration: Any) -> list[Any]:
    """Exact percentiles, the longest and the count of ``duration`` (the
    duration of a rebalance proper, null for an initial join), named as in
    REBALANCE_DURATIONS: the report's durations per bucket of time."""
    from pyspark.sql import functions as F
    return [*durations(duration, "rebalance"), F.count(duration).alias("rebalance_count")]


#: The columns of :func:`rebalance_durations`.
REBALANCE_DURATIONS: tuple[str, ...] = (*duration_names("rebalance"), "rebalance_count")


def fleet_hours(rebalances: Any, hours: Any) -> Any:
    """One row per UTC hour over all groups: ``group_hours`` summed (nulls
    as Spark's ``sum``), the groups that rebalanced and those in a storm,
    exact percentiles over all of the hour's rebalances, and, for the report
    only (not in ``fleet_hours/``), FACT_COUNTS and REBALANCE_DURATIONS: the
    same pass over ``rebalances/`` gives the report's hourly durations."""
    from pyspark.sql import functions as F
    sums = hours.groupBy("hour_start_ms").agg(
        *(F.sum(c).cast("long").alias(c) for c in FLEET_SUMS),
        F.count(F.lit(1)).alias("groups"),
        F.sum(F.when(F.col("storm_rebalances") > 0, 1).otherwise(0)).cast("long")
        .alias("storming_groups"))
    per_hour = rebalances.groupBy(hour_start()).agg(
        *_durations(),
        F.sum(F.col("assignment_error").cast("long")).alias("assignment_errors"),
        F.sum(F.when(F.col("revoked").isNull(), 1).otherwise(0)).cast("long")
        .alias("unreadable"),
        F.sum(F.col("cooperative").cast("long")).alias("cooperative_rebalances"),
        *rebalance_durations(F.when(~is_initial(), F.col("duration_ms"))))
    return sums.join(per_hour, "hour_start_ms")


def fleet_columns() -> list[str]:
    """The columns of ``fleet_hours/``."""
    return ["hour_start_ms", *FLEET_SUMS, "groups", "storming_groups", *DURATIONS]


def histogram(rebalances: Any) -> list[tuple[int, int]]:
    """(bucket, rebalances): bucket b holds durations in [10^(b/5), 10^((b+1)/5))
    ms (durations under 1 ms in bucket 0)."""
    from pyspark.sql import functions as F
    b = F.floor(F.log10(F.greatest(F.col("duration_ms"), F.lit(1)).cast("double")) * 5)
    rows = rebalances.groupBy(b.cast("long").alias("b")).count().orderBy("b").collect()
    return [(int(r["b"]), int(r["count"])) for r in rows]


# ---------------------------------------------------------------- the report's series

#: Widths the report's time series may use: the smallest that gives at most
#: MAX_BUCKETS over the journal's span (a 5-minute incident in minutes, a
#: month in days).
BUCKETS_MS: tuple[int, ...] = (60_000, 300_000, 900_000, HOUR_MS, 6 * HOUR_MS, 24 * HOUR_MS,
                               7 * 24 * HOUR_MS)
MAX_BUCKETS = 300


def bucket_width(first_ms: int, last_ms: int) -> int:
    """The report's bucket width for a journal from ``first_ms`` to ``last_ms``."""
    span = max(0, int(last_ms) - int(first_ms))
    for width in BUCKETS_MS:
        if span // width + 1 <= MAX_BUCKETS:
            return width
    return BUCKETS_MS[-1]


def attribution(journal: Any, top: int) -> list[dict[str, Any]]:
    """Who started rebalances: a join is started by the members that joined,
    a leave, session expiry or join/sync timeout by those that left. The
    ``top`` members by rebalances started, with how many of each kind."""
    from pyspark.sql import functions as F
    joins = F.col("reason").isin("join", "static_change")
    leaves = F.col("reason").isin("leave", "session_expiry", "join_timeout", "sync_timeout")
    who = journal.select(
        "source", "group_id", "reason",
        F.explode(F.when(joins, F.col("joined")).when(leaves, F.col("left"))).alias("member_id"))
    reasons = ("join", "static_change", "leave", "session_expiry", "join_timeout",
               "sync_timeout")
    rows = who.groupBy("source", "group_id", "member_id").agg(
        F.count(F.lit(1)).alias("rebalances"),
        *(F.sum(F.when(F.col("reason") == r, 1).otherwise(0)).cast("long").alias(r)
          for r in reasons)).orderBy(F.desc("rebalances"), "source", "group_id", "member_id") \
        .limit(top).collect()
    return [r.asDict() for r in rows]


def generations(rebalances: Any, keys: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """(source, group_id, started_ms, generation_id, reason) of the groups
    ``keys``, in time order: their generation timelines."""
    from pyspark.sql import functions as F
    if not keys:
        return []
    names = sorted({g for _, g in keys})
    rows = rebalances.where(F.col("group_id").isin(names)) \
        .select("source", "group_id", "started_ms", "generation_id", "reason") \
        .orderBy("started_ms", "journal_id").collect()
    return [r.asDict() for r in rows if (r["source"], r["group_id"]) in keys]
