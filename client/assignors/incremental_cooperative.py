"""``incremental-cooperative``: Kafka Connect's assignor (KIP-415), deferred
imbalance resolution (as "Apache Kafka Rebalance Protocol, or the magic behind
your streams applications" explains it), on top of the cooperative-sticky plan.

* A member that disappears leaves its resources *unassigned* (they are not
  handed out) for up to ``scheduled_rebalance_max_delay_ms``; every
  assignment carries ``delay_ms`` = the time left, so the group rebalances
  again when it runs out. A member that comes back in time (same identity:
  ``group_instance_id`` if static, else member id) gets them back; after the
  delay they are spread over the least-loaded members.
* New resources and new members are balanced as cooperative-sticky does:
  what moves is revoked in one round and handed over in the follow-up.
* Back-off: a round that would revoke right after a round that revoked
  waits ``revocation_backoff_ms`` (doubling with every further revoking
  round, capped at the max delay); meanwhile owners keep what they have and
  ``delay_ms`` asks for the rebalance that will do it. A flapping member
  cannot cause a storm of revoking rebalances.

Purity: the assignor keeps nothing between calls. What it must remember
travels in ``Assignment.user_data``, which every member sends back as
``Subscription.user_data`` (the client library echoes it):

    {"v": 1, "seq": N, "members": [identity, ...],
     "departed": {identity: {"at": ms, "owned": {set: [index, ...]}}},
     "deadline": ms | null, "revoking": k, "last_revoke": ms | null,
     "buddy": [identity, {set: [index, ...]}]}

The group part is the same for everyone; the leader reads the copy with the
highest ``seq``, so a new leader carries on. What a member held is needed
once it is gone, so each member also carries its successor's assignment
(``buddy``, in identity order): a departure is attributed unless a member
and its predecessor vanish in the same round (then its resources are
handed out at once, as cooperative-sticky would). Time is an explicit input:
``assign(..., now_ms=...)``; without it the wall clock is read, the only
impure step (a leader should pass its own clock). JSON keeps the bytes
deterministic and readable; this assignor is meant for Connect-sized groups
(the state is copied to every member).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ._layout import clean_catalog
from .model import Assignment, RebalanceProtocol, Resources, Subscription
from .sticky import sticky_plan

__all__ = ["IncrementalCooperativeAssignor", "State"]

Holdings = dict[str, list[int]]

# Members that carry a copy of the group state, spread over the ring: the
# state survives unless all of them leave in the same round, and the leader's
# SyncGroup request stays O(members) rather than O(members squared).
COPIES = 3


@dataclass(frozen=True)
class State:
    """The group part of ``user_data`` (see the module docs)."""

    seq: int = 0
    members: tuple[str, ...] = ()
    departed: Mapping[str, tuple[int, Holdings]] = field(default_factory=dict)
    deadline: int | None = None
    revoking: int = 0
    last_revoke: int | None = None

    def group_json(self) -> str:
        doc: dict[str, Any] = {
            "members": list(self.members),
            "departed": {
                who: {"at": at, "owned": owned} for who, (at, owned) in self.departed.items()
            },
            "deadline": self.deadline,
            "revoking": self.revoking,
            "last_revoke": self.last_revoke,
        }
        return _dumps(doc)


def _dumps(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _encode(seq: int, buddy: tuple[str, Holdings], group: str | None) -> bytes:
    """One member's user_data; ``group`` (already JSON) only for the holders
    of a copy. Keys in sorted order, like ``_dumps``."""
    parts = [f'"buddy":{_dumps(list(buddy))}']
    if group is not None:
        parts.append(f'"group":{group}')
    parts.append(f'"seq":{seq}')
    parts.append('"v":1')
    return ("{" + ",".join(parts) + "}").encode()


Decoded = tuple[int, State | None, tuple[str, Holdings] | None]


def _decode(data: bytes | None) -> Decoded | None:
    """``(seq, group state if this copy holds one, buddy)`` from one
    member's user_data; None if it is not ours."""
    if not data:
        return None
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("v") != 1:
            return None
        seq = int(doc["seq"])
        state = None
        group = doc.get("group")
        if group is not None:
            departed = {
                str(who): (int(d["at"]), _holdings(d["owned"]))
                for who, d in group["departed"].items()
            }
            state = State(
                seq=seq,
                members=tuple(str(m) for m in group["members"]),
                departed=departed,
                deadline=None if group["deadline"] is None else int(group["deadline"]),
                revoking=int(group["revoking"]),
                last_revoke=None if group["last_revoke"] is None else int(group["last_revoke"]),
            )
        buddy = doc.get("buddy")
        pair = (str(buddy[0]), _holdings(buddy[1])) if buddy else None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    return seq, state, pair


def _holdings(raw: Any) -> Holdings:
    return {str(s): [int(i) for i in idx] for s, idx in dict(raw).items()}


def _revoked(
    owned: Mapping[str, Sequence[int]],
    assigned: Mapping[str, list[int]],
    resources: Mapping[str, int],
) -> set[tuple[str, int]]:
    """What a member owns (validly) and is not given back: it revokes it."""
    out: set[tuple[str, int]] = set()
    for s, idx in owned.items():
        got = assigned.get(s)
        if got is not None and got == idx:  # the common case, compared in C
            continue
        keep = set(got or ())
        n = resources.get(s, 0)
        if isinstance(n, int):
            out.update((s, i) for i in idx if 0 <= i < n and i not in keep)
    return out


def _cut_for_owners(
    planned: Mapping[str, Assignment],
    subscriptions: Mapping[str, Subscription],
    resources: Mapping[str, int],
) -> dict[str, dict[str, list[int]]]:
    """KIP-429's rule on an eager plan: a resource that another member owns
    (validly) is not given to a new owner this round; its owner revokes it
    (the plan does not give it back) and the follow-up hands it over."""
    owner: dict[tuple[str, int], str] = {}
    newest: dict[tuple[str, int], int] = {}
    for m, sub in subscriptions.items():
        for r in _valid(sub.owned, resources):
            # Two claims: the newer generation's is the owner (as the plan reads them).
            if r not in owner or sub.generation > newest[r]:
                owner[r], newest[r] = m, sub.generation
    result: dict[str, dict[str, list[int]]] = {}
    for m, a in planned.items():
        out: dict[str, list[int]] = {}
        for s, idx in a.assigned.items():
            kept = [i for i in idx if owner.get((s, i), m) == m]
            if kept:
                out[s] = kept
        result[m] = out
    return result


def _identity(member_id: str, sub: Subscription) -> str:
    return sub.group_instance_id if sub.group_instance_id is not None else member_id


def _valid(
    owned: Mapping[str, Sequence[int]], resources: Mapping[str, int]
) -> set[tuple[str, int]]:
    out: set[tuple[str, int]] = set()
    for s, idx in owned.items():
        n = resources.get(s, 0)
        if isinstance(n, int):
            out.update((s, i) for i in idx if 0 <= i < n)
    return out


@dataclass(frozen=True)
class IncrementalCooperativeAssignor:
    scheduled_rebalance_max_delay_ms: int = 300_000  # Connect's default, 5 minutes
    revocation_backoff_ms: int = 1_000
    name: str = "incremental-cooperative"
    protocols: tuple[RebalanceProtocol, ...] = (RebalanceProtocol.COOPERATIVE,)

    def assign(
        self,
        resources: Resources,
        subscriptions: Mapping[str, Subscription],
        now_ms: int | None = None,
    ) -> dict[str, Assignment]:
        return self._assign(clean_catalog(resources), subscriptions, now_ms)

    def _assign(
        self,
        resources: Mapping[str, int],
        subscriptions: Mapping[str, Subscription],
        now_ms: int | None,
    ) -> dict[str, Assignment]:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if not subscriptions:
            return {}
        state, buddies = self._read(subscriptions)
        idents = {m: _identity(m, sub) for m, sub in subscriptions.items()}
        present = set(idents.values())

        # Who left since the last round, and who came back.
        departed = dict(state.departed)
        for who in state.members:
            if who not in present and who not in departed:
                departed[who] = (now, buddies.get(who, {}))
        returning = {who: departed.pop(who)[1] for who in list(departed) if who in present}
        deadline = state.deadline
        if not departed or self.scheduled_rebalance_max_delay_ms <= 0:
            departed, deadline = {}, None
        elif deadline is None:
            deadline = now + self.scheduled_rebalance_max_delay_ms
        elif now >= deadline:  # the delay ran out: spread what is still lost
            departed, deadline = {}, None
        claimed: set[tuple[str, int]] = set()
        if departed or returning:
            for sub in subscriptions.values():
                claimed |= _valid(sub.owned, resources)
        reserved: set[tuple[str, int]] = set()
        for _, owned in departed.values():
            reserved |= _valid(owned, resources) - claimed

        # A returning member claims its old resources (if nobody took them).
        top = max((s.generation for s in subscriptions.values()), default=-1)
        subs = dict(subscriptions)
        for m, sub in subscriptions.items():
            back = returning.get(idents[m])
            if back:
                mine = {s: list(i) for s, i in sub.owned.items()}
                for s, i in sorted(_valid(back, resources) - claimed):
                    mine.setdefault(s, []).append(i)
                subs[m] = replace(sub, owned=mine, generation=max(top, sub.generation, 0))

        if subs.keys() == subscriptions.keys() and all(
                subs[m] is subscriptions[m] for m in subs):
            planned = sticky_plan(resources, subs, cooperative=True)
            # Shallow copies: a list is replaced, never changed in place.
            result = {m: dict(a.assigned) for m, a in planned.items()}
        else:
            # A returning member's old resources are claims for the plan's
            # stickiness, not ownership (it restarted, or they were reserved
            # for it): the cooperative rule -- no resource to a new owner
            # while another member still owns it -- applies to the real
            # claims only. Left to the cooperative plan, the part of a return
            # beyond the member's share was withheld from everyone, and with
            # nobody to revoke it no follow-up ever handed it out (simulator
            # seed 112).
            planned = sticky_plan(resources, subs, cooperative=False)
            result = _cut_for_owners(planned, subscriptions, resources)
        if reserved:  # deferred: nobody gets a departed member's resources yet
            for assigned in result.values():
                for s in list(assigned):
                    kept = [i for i in assigned[s] if (s, i) not in reserved]
                    if kept:
                        assigned[s] = kept
                    else:
                        del assigned[s]

        # Revocations and their back-off.
        revoked = {m: _revoked(sub.owned, result[m], resources) for m, sub in subscriptions.items()}
        revoking, last_revoke = state.revoking, state.last_revoke
        timers = [deadline - now] if deadline is not None else []
        if any(revoked.values()):
            wait = 0
            if revoking > 0 and last_revoke is not None:
                backoff = self.revocation_backoff_ms * 2 ** min(revoking - 1, 30)
                wait = last_revoke + min(backoff, self.scheduled_rebalance_max_delay_ms) - now
            if wait > 0:  # too soon: owners keep what nobody else is given
                given = {(s, i) for a in result.values() for s, idx in a.items() for i in idx}
                for m, lost in revoked.items():
                    for s, i in sorted(lost - given):
                        result[m][s] = sorted([*result[m].get(s, ()), i])
                timers.append(wait)
            else:
                revoking, last_revoke = revoking + 1, now
        else:
            revoking = 0

        new_state = State(
            seq=state.seq + 1,
            members=tuple(sorted(present)),
            departed=departed,
            deadline=deadline,
            revoking=revoking,
            last_revoke=last_revoke,
        )
        delay = max(0, min(timers)) if timers else 0
        ring = sorted(idents, key=lambda m: idents[m])
        group = new_state.group_json()
        holders = {ring[k * len(ring) // COPIES] for k in range(COPIES)}
        out: dict[str, Assignment] = {}
        for k, m in enumerate(ring):
            nxt = ring[(k + 1) % len(ring)]
            buddy = (idents[nxt], {s: result[nxt][s] for s in sorted(result[nxt])})
            assigned = {s: result[m][s] for s in sorted(result[m]) if result[m][s]}
            data = _encode(new_state.seq, buddy, group if m in holders else None)
            out[m] = Assignment(assigned, user_data=data, delay_ms=delay)
        return {m: out[m] for m in subscriptions}

    @staticmethod
    def _read(subscriptions: Mapping[str, Subscription]) -> tuple[State, dict[str, Holdings]]:
        """The newest group state among the members, and what each member
        held according to the buddies of that round."""
        decoded = [d for sub in subscriptions.values() if (d := _decode(sub.user_data))]
        copies = [state for _, state, _ in decoded if state is not None]
        if not copies:
            return State(), {}
        newest = max(state.seq for state in copies)
        state = min((s for s in copies if s.seq == newest), key=lambda s: s.group_json())
        buddies = {b[0]: b[1] for seq, _, b in decoded if seq == newest and b is not None}
        return state, buddies
