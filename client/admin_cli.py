"""``groupcoord groups|members|checkpoints|rebalances|resources``: the operator's commands.

Modelled on ``kafka-consumer-groups``: list and describe groups, delete one,
remove a member, ask one to drain (v1.2), show and reset checkpoints (a dry
run unless ``--execute``, with ``--export`` to keep what a reset would
overwrite), the rebalance history, and the resource catalog. Every command talks to the admin API
(:mod:`client.admin`) at ``--url`` / ``GROUPCOORD_URL`` with ``--token`` /
``GROUPCOORD_TOKEN``.

Output: aligned tables for people, ``--json`` for scripts (the server's own
JSON). Exit status: 0 done, 1 refused or unreachable (the reason on one line
of standard error), 2 a usage error (bad arguments, a reset file that does
not parse).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from client.admin import DEFAULT_URL, AdminClient, AdminError
from protocol.admin_docs import RebalanceSummary, checkpoint_bytes_text, shows_placement
from protocol.catalog import (
    DEFAULT_PLACEMENT,
    Placement,
    Summary,
    parse_catalog_placement,
    parse_weights,
    parse_zones,
)
from protocol.validate import ValidationError

__all__ = ["register"]

Command = Callable[[AdminClient, argparse.Namespace, TextIO], int]


class UsageError(Exception):
    """Bad input on the command line or in a file it names (exit status 2)."""


# ---------------------------------------------------------------- registration


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("GROUPCOORD_URL", DEFAULT_URL),
                        help=f"the coordinator's admin URL, or several comma-separated (any "
                             f"coordinator of a cluster answers; the first that accepts a "
                             f"connection is used) (GROUPCOORD_URL; {DEFAULT_URL})")
    common.add_argument("--token", default=os.environ.get("GROUPCOORD_TOKEN"),
                        help="bearer token (GROUPCOORD_TOKEN)")
    common.add_argument("--ca-file", help="CA certificate(s) to verify an https URL with")
    common.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return common


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = _common()

    groups = subparsers.add_parser("groups", help="list, describe, delete groups; remove a member")
    gsub = groups.add_subparsers(dest="groups_command", metavar="ACTION", required=True)
    p = gsub.add_parser("list", parents=[common], help="every group, its state and health")
    p.add_argument("--state", action="append", default=[],
                   help="only groups in this state (repeat, or comma-separated)")
    p.set_defaults(func=_runner(_groups_list))
    p = gsub.add_parser("describe", parents=[common],
                        help="members, hosts, assignments, checkpoints, last rebalances")
    p.add_argument("group")
    p.set_defaults(func=_runner(_groups_describe))
    p = gsub.add_parser("delete", parents=[common], help="delete an Empty group")
    p.add_argument("group")
    p.set_defaults(func=_runner(_groups_delete))
    p = gsub.add_parser("remove-member", parents=[common],
                        help="remove one member (the group rebalances)")
    p.add_argument("group")
    p.add_argument("member")
    p.set_defaults(func=_runner(_groups_remove_member))

    members = subparsers.add_parser("members", help="act on one member of a group: drain it")
    msub = members.add_subparsers(dest="members_command", metavar="ACTION", required=True)
    p = msub.add_parser(
        "drain", parents=[common],
        help="ask a member to hand its resources over, then leave (v1.2)",
        description="Ask a member of a \"resources\" group to drain: its next heartbeat "
                    "answer says so, and it rejoins draining, hands its resources over "
                    "(warmed up first when the group's assignor does that) and leaves. "
                    "MEMBER is a member id, or a static member's instance id.")
    p.add_argument("group")
    p.add_argument("member")
    p.add_argument("--wait", action="store_true",
                   help="wait until the member has left, or drains and owns nothing")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="with --wait: give up after S seconds (600); exit status 1")
    p.set_defaults(func=_runner(_members_drain))

    checkpoints = subparsers.add_parser("checkpoints", help="show or reset a group's checkpoints")
    csub = checkpoints.add_subparsers(dest="checkpoints_command", metavar="ACTION",
                                      required=True)
    p = csub.add_parser("show", parents=[common], help="every checkpoint and its age")
    p.add_argument("group")
    p.set_defaults(func=_runner(_checkpoints_show))
    p = csub.add_parser(
        "reset", parents=[common],
        help="reset checkpoints of an Empty group (a dry run unless --execute)",
        description="Reset checkpoints of an Empty group. Without --execute nothing changes: "
                    "the values before and after are printed. --export F writes the current "
                    "values first, in the format --from-file takes back.")
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--to-value", metavar="V",
                     help="set to V (a JSON scalar such as 42 or true; anything else is text)")
    way.add_argument("--shift-by", type=int, metavar="N", help="add N to integer checkpoints")
    way.add_argument("--delete", action="store_true", help="delete the checkpoints")
    way.add_argument("--from-file", metavar="F", help="set the values of a file from --export")
    p.add_argument("--resources", nargs="+", metavar="SET[:I,J-K]",
                   help="only these resources (default: every checkpoint of the group)")
    p.add_argument("--execute", action="store_true", help="apply the reset")
    p.add_argument("--export", metavar="F", help="first write the current values to F")
    p.add_argument("group")
    p.set_defaults(func=_runner(_checkpoints_reset))

    p = subparsers.add_parser("rebalances", parents=[common],
                              help="a group's rebalance history: why, how long, who, what moved")
    p.add_argument("group")
    p.add_argument("--limit", type=int, default=20, help="most recent N (20)")
    p.set_defaults(func=_runner(_rebalances))

    p = subparsers.add_parser("coordinators", parents=[common],
                              help="the live coordinators, their URLs and the partitions "
                                   "each owns (several coordinators on PostgreSQL)")
    p.set_defaults(func=_runner(_coordinators))

    resources = subparsers.add_parser("resources", help="the resource catalog")
    rsub = resources.add_subparsers(dest="resources_command", metavar="ACTION", required=True)
    p = rsub.add_parser("list", parents=[common],
                        help="every resource set, its size, weights and zones")
    p.set_defaults(func=_runner(_resources_list))
    p = rsub.add_parser("set", parents=[common],
                        help="create or resize a resource set; set its weights and zones",
                        description="Weights and zones given (by flags or --from-file) "
                                    "replace the set's own; those not given are kept.")
    p.add_argument("name")
    p.add_argument("partitions", type=int, nargs="?", help="the set's size (or --partitions)")
    p.add_argument("--partitions", type=int, dest="partitions_flag", metavar="N",
                   help="the set's size")
    p.add_argument("--default-weight", type=float, metavar="W",
                   help="the weight of every resource without its own (1)")
    p.add_argument("--weight", action="append", default=[], metavar="INDEX=W",
                   help="one resource's weight (repeat for more)")
    p.add_argument("--clear-weights", action="store_true",
                   help="every resource weighs 1 again")
    p.add_argument("--default-zone", metavar="ZONE[,ZONE]",
                   help="the zones of every resource without its own (default: anywhere)")
    p.add_argument("--zone", action="append", default=[], metavar="INDEX=ZONE[,ZONE]",
                   help="one resource's home zones (repeat for more)")
    p.add_argument("--clear-zones", action="store_true",
                   help="every resource may be served anywhere again")
    p.add_argument("--from-file", type=Path, metavar="FILE",
                   help="a JSON or TOML file shaped as the API body ({\"partitions\": N, "
                        "\"weights\": ..., \"zones\": ...}); flags given too take "
                        "precedence")
    p.set_defaults(func=_runner(_resources_set))
    p = rsub.add_parser("delete", parents=[common], help="delete a resource set")
    p.add_argument("name")
    p.set_defaults(func=_runner(_resources_delete))
    p = rsub.add_parser("why", parents=[common],
                        help="one resource of a group: its owner in each recent rebalance, "
                             "and why it moved")
    p.add_argument("group")
    p.add_argument("set")
    p.add_argument("index", type=int)
    p.add_argument("--limit", type=int, default=20, help="most recent N rebalances (20)")
    p.set_defaults(func=_runner(_resources_why))


def _runner(command: Command) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            urls = [u.strip() for u in args.url.split(",")] if "," in args.url else args.url
            admin = AdminClient(urls, token=args.token, ca_file=args.ca_file)
            return command(admin, args, sys.stdout)
        except AdminError as exc:
            print(f"groupcoord: {exc.message}", file=sys.stderr)
            return 1
        except (UsageError, ValueError) as exc:
            print(f"groupcoord: {exc}", file=sys.stderr)
            return 2
    return run


# ---------------------------------------------------------------- rendering


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns two spaces apart; a header line first."""
    cells = [list(headers)] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def age(committed_at_ms: object, now_s: float | None = None) -> str:
    """``12s``, ``5m``, ``3h``, ``2d``: how long ago a time in epoch ms was."""
    if not isinstance(committed_at_ms, int | float):
        return "-"
    seconds = max(0.0, (time.time() if now_s is None else now_s) - committed_at_ms / 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _value_text(entry: dict[str, Any], key: str = "value") -> str:
    """A checkpoint value: JSON for a scalar; bytes labelled, as text when they are
    printable UTF-8 (``utf-8:"order-17"``), else in hex (``hex:ff00``)."""
    value = entry.get(key)
    if entry.get("encoding") == "base64" and isinstance(value, str):
        return checkpoint_bytes_text(base64.b64decode(value), "hex")
    return json.dumps(value, ensure_ascii=False)


def _assignment_text(assignment: object) -> str:
    if isinstance(assignment, dict):
        return " ".join(f"{name}:{_ranges(indexes)}" for name, indexes in sorted(assignment.items())
                        if indexes) or "-"
    return str(assignment) or "-"


def _ranges(indexes: Iterable[int]) -> str:
    """``0-3,7``: sorted indexes with runs folded."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(indexes):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def _dump(doc: object, out: TextIO) -> int:
    json.dump(doc, out, indent=2, sort_keys=True)
    out.write("\n")
    return 0


# ---------------------------------------------------------------- groups


def _groups_list(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    states = [s for item in args.state for s in item.split(",") if s]
    groups = admin.list_groups(states)
    if args.json:
        return _dump({"groups": groups}, out)
    rows = [(g["group_id"], g["state"], g.get("health", "-"), g.get("protocol_name") or "-",
             g["generation_id"], g["member_count"]) for g in groups]
    print(table(("GROUP", "STATE", "HEALTH", "PROTOCOL", "GENERATION", "MEMBERS"), rows),
          file=out)
    return 0


def _groups_describe(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    group = admin.describe_group(args.group)
    checkpoints = admin.checkpoints(args.group)
    rebalances = admin.rebalances(args.group, limit=5)
    if args.json:
        return _dump({**group, "checkpoints": checkpoints, "rebalances": rebalances}, out)
    print(f"group {group['group_id']}: {group['state']}, generation {group['generation_id']}, "
          f"protocol {group.get('protocol_type') or '-'}/{group.get('protocol_name') or '-'}, "
          f"leader {group.get('leader') or '-'}", file=out)
    print(f"coordinator: {_coordinator_text(group.get('coordinator'))}", file=out)
    print("", file=out)
    headers: tuple[str, ...] = ("MEMBER", "INSTANCE", "CLIENT", "HOST", "SESSION_MS",
                                "ASSIGNMENT")
    rows: list[tuple[object, ...]] = [
        (m["member_id"], m.get("group_instance_id") or "-", m.get("client_id") or "-",
         m.get("client_host") or "-", m.get("session_timeout_ms"),
         _assignment_text(m.get("assignment")))
        for m in group["members"]]
    if any(shows_placement(m) for m in group["members"]):
        # v1.2: what the members reported for placement, and their standby.
        headers += ("RACK", "CAPACITY", "LOAD", "STANDBY", "WARM", "DRAINING")
        rows = [(*row, m.get("rack") or "-", _number_text(m.get("capacity")),
                 _number_text(m.get("load")), _assignment_text(m.get("standby") or {}),
                 _assignment_text(m.get("warm") or {}), _drain_text(m))
                for row, m in zip(rows, group["members"], strict=True)]
    print(table(headers, rows), file=out)
    print("", file=out)
    _print_checkpoints(checkpoints, out)
    print("", file=out)
    _print_rebalances(rebalances, out)
    return 0


def _drain_text(member: Mapping[str, Any]) -> str:
    """``yes`` (its metadata says draining), ``requested`` (an operator asked; it has
    not rejoined draining yet) or ``-``."""
    if member.get("draining"):
        return "yes"
    return "requested" if member.get("drain_requested") else "-"


def _number_text(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:g}"


def _coordinator_text(coordinator: object) -> str:
    """``coord-2 http://10.0.0.2:9080 (admin http://10.0.0.2:9081), partition 7``."""
    if not isinstance(coordinator, dict):
        return "- (not said by this server)"
    where = f"partition {coordinator.get('partition')}"
    if not coordinator.get("serving", True):
        return f"none now ({where} is moving between coordinators)"
    if not coordinator.get("url"):
        return f"the one answering (it does not know its own URL), {where}"
    text = str(coordinator["url"])
    if coordinator.get("id") not in (None, "local"):
        text = f"{coordinator['id']} {text}"
    if coordinator.get("admin_url"):
        text += f" (admin {coordinator['admin_url']})"
    return f"{text}, {where}"


def _groups_delete(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    admin.delete_group(args.group)
    if args.json:
        return _dump({"deleted": args.group}, out)
    print(f"deleted group {args.group}", file=out)
    return 0


def _groups_remove_member(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    doc = admin.remove_member(args.group, args.member)
    if args.json:
        return _dump(doc if doc is not None else {"removed": args.member}, out)
    print(f"removed member {args.member} from group {args.group}; the group rebalances",
          file=out)
    return 0


# ---------------------------------------------------------------- members


#: seconds between two looks at the group while ``members drain --wait`` waits.
DRAIN_POLL_S = 1.0


def _members_drain(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    doc = admin.drain_member(args.group, args.member)
    who = doc["member_id"] + (f" (instance {doc['group_instance_id']})"
                              if doc.get("group_instance_id") else "")
    if not args.json:
        if doc["draining"]:
            print(f"member {who} of group {args.group} is draining already", file=out)
        else:
            print(f"asked member {who} of group {args.group} to drain: its next heartbeat "
                  f"answer says so; it hands its resources over, then leaves", file=out)
    if not args.wait:
        return _dump(doc, out) if args.json else 0
    outcome = wait_drained(admin, args.group, doc["member_id"], doc.get("group_instance_id"),
                           args.timeout)
    if args.json:
        return _dump({**doc, "outcome": outcome}, out)
    if outcome == "timeout":
        print(f"groupcoord: member {who} has neither left nor drained down to nothing "
              f"after {args.timeout:g} s; see groupcoord groups describe {args.group}",
              file=sys.stderr)
        return 1
    print(f"member {who} " + ("has left the group" if outcome == "left"
                              else "drains and owns nothing now"), file=out)
    return 0


def wait_drained(admin: AdminClient, group_id: str, member_id: str, instance_id: str | None,
                 timeout_s: float) -> str:
    """Poll the group until the member has left (``"left"``) or reports draining and
    owns nothing (``"owns_nothing"``; a member that drains without leaving), else
    ``"timeout"``. A static member is followed by its instance id (a restart
    gives it a new member id)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            group = admin.describe_group(group_id)
        except AdminError as exc:
            if exc.code != "UNKNOWN_GROUP":
                raise
            return "left"  # the group itself is gone
        found = next((m for m in group["members"]
                      if m["member_id"] == member_id
                      or (instance_id is not None and m.get("group_instance_id") == instance_id)),
                     None)
        if found is None:
            return "left"
        owned = found.get("assignment")
        if found.get("draining") and isinstance(owned, dict) and not any(owned.values()):
            return "owns_nothing"
        if time.monotonic() >= deadline:
            return "timeout"
        time.sleep(min(DRAIN_POLL_S, max(0.0, deadline - time.monotonic())))


# ---------------------------------------------------------------- checkpoints


def _print_checkpoints(checkpoints: list[dict[str, Any]], out: TextIO) -> None:
    now = time.time()
    rows = [(c["set"], c["index"], _value_text(c), age(c.get("committed_at"), now),
             c.get("member_id") or "-", c.get("generation_id", "-"))
            for c in checkpoints]
    print(table(("SET", "INDEX", "VALUE", "AGE", "MEMBER", "GENERATION"), rows), file=out)


def _checkpoints_show(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    checkpoints = admin.checkpoints(args.group)
    if args.json:
        return _dump({"checkpoints": checkpoints}, out)
    _print_checkpoints(checkpoints, out)
    return 0


def parse_resources(items: Sequence[str], known: Iterable[tuple[str, int]]
                    ) -> list[tuple[str, int]]:
    """``orders:0-3,7 users`` -> resources; a bare set name means every known index of it."""
    known_list = sorted(set(known))
    chosen: list[tuple[str, int]] = []
    for item in items:
        name, sep, spec = item.partition(":")
        if not name:
            raise UsageError(f"--resources: {item!r} has no set name (SET or SET:0-3,7)")
        if not sep:
            chosen += [r for r in known_list if r[0] == name]
            continue
        for part in spec.split(","):
            lo, dash, hi = part.partition("-")
            try:
                first, last = int(lo), int(hi if dash else lo)
            except ValueError:
                raise UsageError(f"--resources: {part!r} in {item!r} is not an index "
                                 f"or a range I-J") from None
            if first < 0 or last < first:
                raise UsageError(f"--resources: bad range {part!r} in {item!r}")
            chosen += [(name, i) for i in range(first, last + 1)]
    return sorted(set(chosen))


def _scalar(text: str) -> Any:
    """``--to-value``: a JSON scalar if it is one, else the text itself."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, dict | list):
        raise UsageError(f"--to-value: {text!r} is not a scalar (a number, true/false, "
                         f"null or text)")
    return value


def export_doc(group_id: str, checkpoints: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``--export`` writes: the checkpoints in the listing's own shape."""
    keep = ("set", "index", "value", "encoding")
    return {"group_id": group_id, "exported_at_ms": int(time.time() * 1000),
            "checkpoints": [{k: c[k] for k in keep if k in c} for c in checkpoints]}


def read_reset_file(path: str) -> list[list[Any]]:
    """The ``values`` of a reset from an ``--export`` file (:class:`UsageError` if bad)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--from-file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--from-file {path}: not JSON ({exc})") from None
    entries = doc.get("checkpoints") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise UsageError(f"--from-file {path}: expected an object with a \"checkpoints\" list "
                         f"(as --export writes)")
    values: list[list[Any]] = []
    for n, entry in enumerate(entries):
        where = f"--from-file {path}: checkpoints[{n}]"
        if not isinstance(entry, dict):
            raise UsageError(f"{where}: expected an object {{set, index, value}}")
        name, index = entry.get("set"), entry.get("index")
        if not isinstance(name, str) or not name:
            raise UsageError(f"{where}: \"set\" must be a non-empty string")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise UsageError(f"{where}: \"index\" must be a non-negative integer")
        if "value" not in entry:
            raise UsageError(f"{where}: \"value\" is missing")
        value = entry["value"]
        if entry.get("encoding") == "base64":
            if not isinstance(value, str):
                raise UsageError(f"{where}: a base64 value must be a string")
            values.append([name, index, value, "base64"])
        elif isinstance(value, dict | list):
            raise UsageError(f"{where}: \"value\" must be a scalar")
        else:
            values.append([name, index, value])
    return values


def _checkpoints_reset(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    values = read_reset_file(args.from_file) if args.from_file else None
    to_value = _scalar(args.to_value) if args.to_value is not None else None
    current: list[dict[str, Any]] | None = None
    resources = None
    if args.resources or args.export:
        current = admin.checkpoints(args.group)
    if args.resources:
        assert current is not None
        resources = parse_resources(args.resources,
                                    ((c["set"], c["index"]) for c in current))
    if args.export:
        assert current is not None
        chosen = set(resources) if resources is not None else None
        kept = [c for c in current if chosen is None or (c["set"], c["index"]) in chosen]
        try:
            Path(args.export).write_text(
                json.dumps(export_doc(args.group, kept), indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--export {args.export}: {exc.strerror or exc}") from None
    doc = admin.reset_checkpoints(
        args.group, dry_run=not args.execute, resources=resources,
        to_value=to_value, shift_by=args.shift_by, delete=args.delete, values=values)
    if args.json:
        return _dump(doc, out)
    before = {(c["set"], c["index"]): _value_text(c) for c in doc.get("before", [])}
    after = {(c["set"], c["index"]): _value_text(c) for c in doc.get("after", [])}
    rows = [(s, i, before.get((s, i), "-"), after.get((s, i), "-"))
            for s, i in sorted(before.keys() | after.keys())]
    print(table(("SET", "INDEX", "BEFORE", "AFTER"), rows), file=out)
    if doc.get("dry_run", True):
        print("dry run: nothing changed; add --execute to apply", file=out)
    else:
        print(f"reset {len(rows)} checkpoint(s) of group {args.group}", file=out)
    if args.export:
        print(f"the values before are in {args.export} (undo with --from-file {args.export})",
              file=out)
    return 0


# ---------------------------------------------------------------- rebalances


def utc_time(epoch_ms: int) -> str:
    """``2026-01-31T12:00:05Z``: a time in Unix epoch ms, in UTC to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_ms / 1000))


def causes_text(causes: Mapping[str, int]) -> str:
    """``load:3 join:12``: moves by cause, the most first (ties by name); ``-``: none."""
    ranked = sorted(causes.items(), key=lambda item: (-item[1], item[0]))
    return " ".join(f"{cause}:{n}" for cause, n in ranked) or "-"


def _print_rebalances(rebalances: list[RebalanceSummary], out: TextIO) -> None:
    rows = []
    for r in rebalances:
        moves = r["resources"]  # None: not the resources protocol, nothing to count
        rows.append((r["generation_id"], utc_time(r["ended_ms"]), r["reason"] or "-",
                     r["duration_ms"], ",".join(r["joined"]) or "-",
                     ",".join(r["left"]) or "-",
                     "-" if moves is None else moves["moved"],
                     "-" if moves is None else moves["assigned"],
                     "-" if moves is None else moves["revoked"],
                     "-" if moves is None else causes_text(moves.get("causes", {}))))
    print(table(("GENERATION", "ENDED", "REASON", "DURATION_MS", "JOINED", "LEFT", "MOVED",
                 "ASSIGNED", "REVOKED", "CAUSES"), rows), file=out)


def _rebalances(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    rebalances = admin.rebalances(args.group, limit=args.limit)
    if args.json:
        return _dump({"rebalances": rebalances}, out)
    _print_rebalances(rebalances, out)
    return 0


# ---------------------------------------------------------------- coordinators


def _coordinators(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    rows = admin.coordinators()
    if args.json:
        return _dump({"coordinators": rows}, out)
    print(table(("ID", "URL", "ADMIN URL", "PARTITIONS", "OWNED"), [
        (c["id"] + (" *" if c.get("self") else ""), c["url"], c.get("admin_url") or "-",
         len(c["partitions"]), _ranges([p["partition"] for p in c["partitions"]]) or "-")
        for c in rows]), file=out)
    return 0


# ---------------------------------------------------------------- the catalog


def _resources_list(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    doc = admin.list_resources()
    if args.json:
        return _dump(doc, out)
    resources: dict[str, int] = doc["resources"]
    try:
        placement = parse_catalog_placement(doc, resources)
    except ValidationError as exc:
        raise AdminError(0, "BAD_ANSWER", f"the catalog's answer is malformed: {exc}") from None
    rows = []
    for name, partitions in sorted(resources.items()):
        summary = Summary.of(partitions, placement.get(name, DEFAULT_PLACEMENT))
        rows.append((name, partitions, summary.weights_text(), summary.zones_text()))
    print(table(("SET", "PARTITIONS", "WEIGHTS", "ZONES"), rows), file=out)
    print(f"resources_epoch {doc['resources_epoch']}", file=out)
    return 0


def _resources_set(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    body = _resource_body(args)
    partitions = body.get("partitions")
    if partitions is None:
        raise UsageError("the set's size is missing: give PARTITIONS, --partitions or a "
                         "\"partitions\" in --from-file")
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise UsageError(f"partitions must be an integer of at least 1, got {partitions!r}")
    doc = admin.set_resource(args.name, partitions, weights=body.get("weights"),
                             zones=body.get("zones"))
    if args.json:
        return _dump(doc, out)
    summary = Summary.of(partitions, Placement(
        parse_weights(doc.get("weights", {}), "weights", partitions),
        parse_zones(doc.get("zones", {}), "zones", partitions)))
    print(f"{args.name}: {partitions} partitions; weights {summary.weights_text()}; zones "
          f"{summary.zones_text()} (resources_epoch {doc['resources_epoch']})", file=out)
    return 0


def _resource_body(args: argparse.Namespace) -> dict[str, Any]:
    """The ``PUT /v1/resources/{name}`` body: the file's, then what the flags say."""
    body: dict[str, Any] = {} if args.from_file is None else _resource_file(args.from_file)
    sizes = {n for n in (args.partitions, args.partitions_flag) if n is not None}
    if len(sizes) > 1:
        raise UsageError(f"PARTITIONS and --partitions differ ({args.partitions} and "
                         f"{args.partitions_flag})")
    if sizes:
        body["partitions"] = sizes.pop()
    if args.clear_weights or args.default_weight is not None or args.weight:
        given = {} if args.clear_weights else body.get("weights", {})
        if not isinstance(given, dict):
            raise UsageError("--from-file: \"weights\" must be an object")
        weights = dict(given)
        if args.default_weight is not None:
            weights["default"] = args.default_weight
        weights["overrides"] = _merged(weights.get("overrides", []), "weights.overrides",
                                       [_weight_flag(text) for text in args.weight])
        body["weights"] = weights
    if args.clear_zones or args.default_zone is not None or args.zone:
        given = {} if args.clear_zones else body.get("zones", {})
        if not isinstance(given, dict):
            raise UsageError("--from-file: \"zones\" must be an object")
        zones = dict(given)
        if args.default_zone is not None:
            zones["default"] = _zone_names(args.default_zone, "--default-zone")
        zones["overrides"] = _merged(zones.get("overrides", []), "zones.overrides",
                                     [_zone_flag(text) for text in args.zone])
        body["zones"] = zones
    return body


def _merged(overrides: object, field: str, flags: list[tuple[int, Any]]) -> list[list[Any]]:
    """The file's ``[[index, x], ...]`` with the flags' pairs taking the place of those
    of the same index."""
    if not isinstance(overrides, list):
        raise UsageError(f"--from-file: {field} must be a list of [index, value] pairs")
    given = {i for i, _ in flags}
    kept = [pair for pair in overrides
            if not (isinstance(pair, list) and pair and pair[0] in given)]
    return kept + [[i, x] for i, x in flags]


def _index(text: str, flag: str, item: str) -> int:
    try:
        index = int(text)
    except ValueError:
        raise UsageError(f"{flag}: {item!r}: {text!r} is not an index") from None
    if index < 0:
        raise UsageError(f"{flag}: {item!r}: the index must be >= 0")
    return index


def _weight_flag(item: str) -> tuple[int, float]:
    """``--weight 3=40`` -> ``(3, 40.0)``."""
    index, sep, value = item.partition("=")
    if not sep:
        raise UsageError(f"--weight: {item!r} is not INDEX=WEIGHT")
    try:
        weight = float(value)
    except ValueError:
        raise UsageError(f"--weight: {item!r}: {value!r} is not a number") from None
    return _index(index, "--weight", item), weight


def _zone_flag(item: str) -> tuple[int, list[str]]:
    """``--zone 4=eu-1a,eu-1b`` -> ``(4, ["eu-1a", "eu-1b"])``."""
    index, sep, value = item.partition("=")
    if not sep:
        raise UsageError(f"--zone: {item!r} is not INDEX=ZONE[,ZONE]")
    return _index(index, "--zone", item), _zone_names(value, "--zone")


def _zone_names(text: str, flag: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise UsageError(f"{flag}: {text!r}: an empty zone name")
    return names


def _resource_file(path: Path) -> dict[str, Any]:
    """A JSON or (``.toml``) TOML file shaped as the API body."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--from-file {path}: {exc.strerror or exc}") from None
    try:
        doc: object = (tomllib.loads(raw.decode("utf-8")) if path.suffix.lower() == ".toml"
                       else json.loads(raw))
    except (ValueError, UnicodeDecodeError) as exc:  # TOMLDecodeError is a ValueError
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        raise UsageError(f"--from-file {path}: not {kind} ({exc})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"--from-file {path}: expected an object with \"partitions\", "
                         f"\"weights\", \"zones\"")
    return doc


def _resources_why(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    if args.index < 0:
        raise UsageError("index must be at least 0")
    doc = admin.resource_history(args.group, args.set, args.index, limit=args.limit)
    if args.json:
        return _dump(doc, out)
    print(f"{args.set}:{args.index} of group {args.group}, newest first", file=out)
    print(table(("GENERATION", "ENDED", "OWNER", "CHANGE", "CAUSE", "REASON", "STANDBY"), [
        (g["generation_id"], utc_time(g["ended_ms"]), g["owner"] or "-", g["change"],
         g["cause"] or "-", g["reason"] or "-", ",".join(g["standby"]) or "-")
        for g in doc["generations"]]), file=out)
    return 0


def _resources_delete(admin: AdminClient, args: argparse.Namespace, out: TextIO) -> int:
    doc = admin.delete_resource(args.name)
    if args.json:
        return _dump(doc, out)
    print(f"deleted {args.name} (resources_epoch {doc['resources_epoch']})", file=out)
    return 0
