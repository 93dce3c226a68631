"""A small synchronous client of the coordinator's admin API (docs/protocol.md, "Admin (JSON)").

It is what ``groupcoord groups|checkpoints|rebalances|resources`` stand on, and
a script can use it directly::

    from client.admin import AdminClient
    admin = AdminClient("http://127.0.0.1:9081", token=os.environ.get("GROUPCOORD_TOKEN"))
    for group in admin.list_groups(states=["Stable"]):
        print(group["group_id"], group["generation_id"])

Synchronous on purpose: an operator's command makes a handful of calls, one
after the other; the standard library's ``urllib`` does that with TLS and
nothing to install. Every failure, whatever its layer (refused by the server,
no connection, a body that is not JSON), surfaces as one :class:`AdminError`
whose message is one line an operator can act on.
"""

from __future__ import annotations

import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from protocol.admin_docs import RebalanceSummary, ResourceHistory
from protocol.codec import DecodeError
from protocol.codec import decode as decode_msgpack
from protocol.messages import LISTENER_FIELD, PROTOCOL_LISTENER

#: the admin API's default address (``groupcoord serve``'s ``--admin-port``).
DEFAULT_URL = "http://127.0.0.1:9081"


class AdminError(Exception):
    """A call that did not succeed: ``status`` 0 when the server was not reached."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class _NotConnected(Exception):
    """No connection could be made (refused, unknown host): nothing was sent."""

    def __init__(self, reason: object) -> None:
        super().__init__(str(reason))
        self.reason = reason


def _quote(segment: str) -> str:
    # Every character but the unreserved ones is escaped, "/" included: a group
    # id is one path segment whatever it contains.
    return urllib.parse.quote(segment, safe="")


class AdminClient:
    """Calls of the admin API at ``url`` (scheme, host and port; no path).

    ``url`` may be a list: the admin API of several coordinators sharing a
    database answers the same at each (docs/protocol.md, "Several coordinators
    sharing groups"), so a call goes to
    the first that accepts a connection, and to that one first from then on
    (``url``). Only a connection that could not be made moves on to the
    next: a call that reached a server (an answer, a time-out) is never
    sent twice."""

    def __init__(self, url: str | Sequence[str] = DEFAULT_URL, *, token: str | None = None,
                 ca_file: str | None = None, timeout_s: float = 10.0) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("url: give at least one admin URL")
        for one in urls:
            parsed = urllib.parse.urlsplit(one) if isinstance(one, str) else None
            if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ValueError(
                    f"url: expected http://HOST:PORT or https://HOST:PORT, got {one!r}")
        self.urls = [one.rstrip("/") for one in urls]
        #: the URL calls go to first (the last that accepted a connection).
        self.url = self.urls[0]
        self._token = token
        self._timeout_s = timeout_s
        self._context: ssl.SSLContext | None = None
        if any(one.startswith("https:") for one in self.urls):
            self._context = ssl.create_default_context(cafile=ca_file)

    # ------------------------------------------------------------ transport

    def request(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
                body: Any = None) -> Any:
        """One call; the decoded JSON answer (``None`` for an empty one)."""
        failures: list[str] = []
        for base in [self.url, *(u for u in self.urls if u != self.url)]:
            try:
                answer = self._request_at(base, method, path, query, body)
            except _NotConnected as exc:
                failures.append(f"{base}: {exc.reason}")
                continue
            self.url = base
            return answer
        raise AdminError(0, "CONNECTION_FAILED", "cannot reach " + "; ".join(failures))

    def _request_at(self, base: str, method: str, path: str,
                    query: Mapping[str, str] | None, body: Any) -> Any:
        target = base + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(target, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(req, timeout=self._timeout_s,
                                        context=self._context) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as exc:
            raise self._refusal(base, exc) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise AdminError(0, "TLS_VERIFICATION_FAILED",
                                 f"{base}: the server's certificate was not verified "
                                 f"({reason.verify_message}); pass --ca-file") from None
            if isinstance(reason, (ConnectionRefusedError, socket.gaierror)):
                raise _NotConnected(reason) from None  # nothing was sent: try the next
            raise AdminError(0, "CONNECTION_FAILED",
                             f"cannot reach {base}: {reason}") from None
        except (TimeoutError, OSError) as exc:
            raise AdminError(0, "CONNECTION_FAILED",
                             f"cannot reach {base}: {exc}") from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise AdminError(200, "INVALID_RESPONSE",
                             f"{method} {path}: the answer is not JSON") from None

    def _refusal(self, base: str, exc: urllib.error.HTTPError) -> AdminError:
        raw = exc.read()
        code, message = f"HTTP_{exc.code}", ""
        doc: object = None
        try:
            if exc.headers.get_content_type() == "application/msgpack":
                doc = decode_msgpack(raw)  # the protocol listener's refusals
            else:
                doc = json.loads(raw)
        except (ValueError, DecodeError):
            doc = None
        if isinstance(doc, dict):
            code = str(doc.get("error") or code)
            message = str(doc.get("message") or "")
            if doc.get(LISTENER_FIELD) == PROTOCOL_LISTENER:
                # The workers' port: say so, and where the admin API is (the
                # server's message ends with that).
                return AdminError(exc.code, "WRONG_LISTENER", (
                    f"{base} is the coordinator's protocol listener (the workers' port), "
                    f"not its admin listener: {message.rpartition('; ')[2]}"))
        explanation = _EXPLAIN.get(code, "")
        text = f"{code}"
        if message:
            text += f": {message}"
        elif explanation:
            text += f": {explanation}"
        return AdminError(exc.code, code, text)

    # ------------------------------------------------------------ groups

    def list_groups(self, states: Sequence[str] = ()) -> list[dict[str, Any]]:
        query = {"state": ",".join(states)} if states else None
        doc = self.request("GET", "/v1/groups", query=query)
        return list(doc["groups"])

    def describe_group(self, group_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = self.request("GET", f"/v1/groups/{_quote(group_id)}")
        return doc

    def delete_group(self, group_id: str) -> None:
        self.request("DELETE", f"/v1/groups/{_quote(group_id)}")

    def remove_member(self, group_id: str, member_id: str) -> Any:
        return self.request(
            "DELETE", f"/v1/groups/{_quote(group_id)}/members/{_quote(member_id)}")

    def drain_member(self, group_id: str, member: str) -> dict[str, Any]:
        """Ask a member (a member id, or a static member's instance id) to drain
        (v1.2): ``{group_id, member_id, group_instance_id, drain_requested, draining}``."""
        doc: dict[str, Any] = self.request(
            "POST", f"/v1/groups/{_quote(group_id)}/members/{_quote(member)}/drain")
        return doc

    def rebalances(self, group_id: str, limit: int = 20) -> list[RebalanceSummary]:
        """The newest ``limit`` rebalances, newest first, in the shape the server
        builds them (:class:`protocol.admin_docs.RebalanceSummary`)."""
        doc = self.request("GET", f"/v1/groups/{_quote(group_id)}/rebalances",
                           query={"limit": str(limit)})
        return cast(list[RebalanceSummary], list(doc["rebalances"]))

    def resource_history(self, group_id: str, resource_set: str, index: int,
                         limit: int = 20) -> ResourceHistory:
        """One resource's owner in each of the newest ``limit`` rebalances, newest
        first, and why it changed (:class:`protocol.admin_docs.ResourceHistory`)."""
        doc = self.request(
            "GET", f"/v1/groups/{_quote(group_id)}/resources/{_quote(resource_set)}/"
                   f"{index}/history", query={"limit": str(limit)})
        return cast(ResourceHistory, doc)

    # ------------------------------------------------------------ checkpoints

    def checkpoints(self, group_id: str) -> list[dict[str, Any]]:
        doc = self.request("GET", f"/v1/groups/{_quote(group_id)}/checkpoints")
        return list(doc["checkpoints"])

    def reset_checkpoints(self, group_id: str, *, dry_run: bool,
                          resources: Iterable[tuple[str, int]] | None = None,
                          to_value: Any = None, shift_by: int | None = None,
                          delete: bool = False,
                          values: Sequence[Sequence[Any]] | None = None) -> dict[str, Any]:
        """``POST .../checkpoints/reset``: exactly one of the four ways is given."""
        body: dict[str, Any] = {"dry_run": dry_run}
        if resources is not None:
            body["resources"] = [[s, i] for s, i in resources]
        ways = [name for name, given in (("to_value", to_value is not None),
                                         ("shift_by", shift_by is not None),
                                         ("delete", delete), ("values", values is not None))
                if given]
        if len(ways) != 1:
            raise ValueError("give exactly one of to_value, shift_by, delete, values")
        if to_value is not None:
            body["to_value"] = to_value
        if shift_by is not None:
            body["shift_by"] = shift_by
        if delete:
            body["delete"] = True
        if values is not None:
            body["values"] = [list(v) for v in values]
        doc: dict[str, Any] = self.request(
            "POST", f"/v1/groups/{_quote(group_id)}/checkpoints/reset", body=body)
        return doc

    # ------------------------------------------------------------ coordinators

    def coordinators(self) -> list[dict[str, Any]]:
        """``GET /v1/coordinators``: the live coordinators and the partitions each owns."""
        doc: dict[str, Any] = self.request("GET", "/v1/coordinators")
        rows: list[dict[str, Any]] = doc["coordinators"]
        return rows

    # ------------------------------------------------------------ the catalog

    def list_resources(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.request("GET", "/v1/resources")
        return doc

    def set_resource(self, name: str, partitions: int, *,
                     weights: Mapping[str, Any] | None = None,
                     zones: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``PUT /v1/resources/{name}``. ``weights`` (``{"default": W, "overrides":
        [[index, w], ...]}``) and ``zones`` (``{"default": null | [zone, ...],
        "overrides": [[index, [zone, ...]], ...]}``) replace the set's own when given;
        ``None`` keeps them. Answers the set as the catalog then holds it."""
        body: dict[str, Any] = {"partitions": partitions}
        if weights is not None:
            body["weights"] = dict(weights)
        if zones is not None:
            body["zones"] = dict(zones)
        doc: dict[str, Any] = self.request("PUT", f"/v1/resources/{_quote(name)}", body=body)
        return doc

    def delete_resource(self, name: str) -> dict[str, Any]:
        doc: dict[str, Any] = self.request("DELETE", f"/v1/resources/{_quote(name)}")
        return doc


#: what a bare error code means to an operator, when the server said no more.
_EXPLAIN = {
    "UNKNOWN_GROUP": "no such group",
    "UNKNOWN_MEMBER_ID": "no such member in the group",
    "UNKNOWN_RESOURCE": "no such resource set in the catalog",
    "NON_EMPTY_GROUP": "the group has members; stop them first (or remove them)",
    "GROUP_AUTHORIZATION_FAILED": "the token is not granted this (admin grant needed)",
    "HTTP_401": "a valid token is needed (--token or GROUPCOORD_TOKEN)",
    "HTTP_403": "the token does not have the role this needs",
    "COORDINATOR_LOAD_IN_PROGRESS": "the coordinator is still loading; try again",
    "COORDINATOR_NOT_AVAILABLE": "the coordinator is not serving (storage failure?)",
}
