"""The decisions of a member's router, without I/O (docs/protocol.md, "Several
coordinators sharing groups"; Kafka's consumer: coordinator unknown ->
FindCoordinator -> send there).

:class:`Routing` decides, for each call a member sends, where each leg of it
goes and when the call is over; its drivers carry the legs out and report
what came back. :class:`~client.transport.CoordinatorRouter` drives it with
asyncio over HTTP; the deterministic simulator (tests/sim/cluster.py) drives
the same object over its simulated network. A driver:

1. ``call = routing.new_call(api)``, then performs ``routing.route(call)``;
2. performs every effect an input returns, in order:

   - :class:`SendCall`: send the call's request to ``url``; report its
     response with :meth:`Routing.answered`, a failure to get one (an
     exception, ``NOT_COORDINATOR`` and ``COORDINATOR_LOAD_IN_PROGRESS``
     included, as :class:`~client.errors.NotCoordinatorError`) with
     :meth:`Routing.failed`;
   - :class:`AskFind`: ask ``find_coordinator`` of ``url``, bounded by
     :attr:`Routing.find_timeout_ms` (then :meth:`Routing.find_timed_out`);
     report the answer or failure the same way;
   - :class:`Answer` / :class:`Fail`: the call is over, with this response or
     this error; a leg still in flight is abandoned (the call was waiting on a
     coordinator given up);
   - :class:`CoordinatorChanged` / :class:`RedirectRefused`: to log;
3. reports the caller giving up (its own timeout, cancelled) with
   :meth:`Routing.cancelled`, and the member's timeout of a call with
   :meth:`Routing.timed_out`.

An effect may concern another call than the one whose input produced it: a
call waiting for another's ``find_coordinator`` round goes on when it ends,
and a call in flight to a coordinator given up fails when another is found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from client.errors import CoordinatorUnavailableError, NotCoordinatorError
from protocol.errors import ErrorCode
from protocol.messages import FindCoordinatorResponse

__all__ = [
    "MAX_REDIRECTS",
    "Answer",
    "AskFind",
    "CoordinatorChanged",
    "CoordinatorChoice",
    "Fail",
    "RedirectRefused",
    "RoutedCall",
    "Routing",
    "RoutingEffect",
    "SendCall",
    "check_coordinator_url",
    "redact_url",
]

#: ``NOT_COORDINATOR`` answers followed within one call.
MAX_REDIRECTS = 3


def redact_url(url: str) -> str:
    """``url`` without the user name and password it may carry (for logs and
    error messages)."""
    try:
        parts = urlsplit(url)
        if parts.username is None and parts.password is None:
            return url
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port is not None else host
    except ValueError:  # a port that is not a number: show no part of the netloc
        return "<unparsable URL>"
    return urlunsplit(parts._replace(netloc=netloc))


def check_coordinator_url(url: object, *, tls_settings: bool = False) -> str:
    """``url`` if it can name a coordinator (``http://`` or ``https://`` and a
    host); else ``ValueError`` naming it. ``tls_settings``: the caller gave a
    CA or an SSL context, which only an ``https://`` URL can use."""
    if not isinstance(url, str):
        raise ValueError(f"coordinator URL must be a string, got {url!r}")
    shown = redact_url(url)
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"coordinator URL must start with http:// or https://: {shown!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ValueError(f"coordinator URL {shown!r} cannot be parsed: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"coordinator URL has no host: {shown!r}")
    if tls_settings and url.startswith("http://"):
        raise ValueError(f"ca_file/ssl_context need an https:// coordinator URL: {shown!r}")
    return url


class CoordinatorChoice:
    """Which coordinator a member's calls go to (the state :class:`Routing`
    keeps across calls).

    ``current``: the group's coordinator as last learned (``None``: unknown;
    with one bootstrap URL, that URL from the start). ``find_order()``: whom to
    ask ``find_coordinator``, from the last that answered, the coordinator just
    given up last.
    """

    __slots__ = ("bootstrap", "current", "failed", "first", "https_only")

    def __init__(self, bootstrap: Sequence[str]) -> None:
        urls = tuple(dict.fromkeys(u.rstrip("/") for u in bootstrap))
        if not urls:
            raise ValueError("give at least one coordinator URL")
        self.bootstrap = urls
        #: given https:// URLs, the member follows no server to http:// (its
        #: token would then travel in clear).
        self.https_only = any(u.startswith("https://") for u in urls)
        self.current: str | None = urls[0] if len(urls) == 1 else None
        #: where the next find_coordinator round starts (the last that answered).
        self.first = 0
        #: the coordinator last given up (asked last in the next round).
        self.failed: str | None = None

    def find_order(self) -> list[str]:
        """The bootstrap URLs in the order a ``find_coordinator`` round asks them:
        from the last that answered; the coordinator just given up last (killed
        or paused, it would cost a timeout each round)."""
        urls = self.bootstrap
        order = [(self.first + k) % len(urls) for k in range(len(urls))]
        order.sort(key=lambda j: urls[j] == self.failed)
        return [urls[j] for j in order]

    def answered(self, url: str) -> None:
        """``url`` (a bootstrap URL) answered ``find_coordinator``."""
        self.first = self.bootstrap.index(url)

    def none_answered(self) -> None:
        """A ``find_coordinator`` round got no answer: the next starts one further."""
        self.first = (self.first + 1) % len(self.bootstrap)

    def check_named(self, url: str) -> None:
        """A coordinator URL a server named; ``ValueError`` if this member must not
        use it: not a coordinator URL (:func:`check_coordinator_url`), or not
        ``https://`` when the member was given ``https://`` URLs."""
        check_coordinator_url(url)
        if self.https_only and not url.startswith("https://"):
            raise ValueError(f"{redact_url(url)!r} is not an https:// URL, and this member "
                             f"was given https:// URLs")

    def forget(self, url: str) -> None:
        """``url`` failed (no answer, a reset, ``COORDINATOR_NOT_AVAILABLE``): the
        coordinator is unknown again, if it was ``url``."""
        if self.current == url:
            self.current = None
            self.failed = url

    def redirect_target(self, url: str, owner: str) -> str | None:
        """``url`` answered ``NOT_COORDINATOR`` naming ``owner`` (or nobody): the
        URL to follow (to be checked with :meth:`check_named`), or ``None`` (the
        caller forgets ``url``: look again). Only while ``url`` is current:
        another call may have moved on already (then ``""``: nothing to do)."""
        if self.current != url:
            return ""
        owner = owner.rstrip("/")
        if not owner or owner == url:
            return None
        return owner

    def found_target(self, asked: str, response: FindCoordinatorResponse) -> str:
        """``asked`` answered ``find_coordinator``: the group's coordinator (to be
        checked with :meth:`check_named` unless it is ``asked``), or
        :class:`CoordinatorUnavailableError` when none serves the group now."""
        if response.error is not None:
            raise CoordinatorUnavailableError(
                f"no coordinator serves the group now (find_coordinator at "
                f"{redact_url(asked)}: {response.error.value})")
        if not response.url:
            # No error and no other URL: the server asked serves the group (a
            # one-process server that does not know its advertised URL); should
            # it not, its NOT_COORDINATOR corrects it.
            return asked
        return response.url.rstrip("/")


class RoutedCall:
    """One call of the member as :class:`Routing` sees it (a handle for the
    driver: compare by identity; read, never write). ``url``: where its current
    leg went (``""`` before the first); ``finding``: that leg is a
    ``find_coordinator``; ``done``: the call is over (an :class:`Answer` or
    :class:`Fail` was given, or it was cancelled)."""

    __slots__ = ("api", "done", "failures", "find_left", "finding", "redirects", "url")

    def __init__(self, api: str) -> None:
        self.api = api
        self.url = ""
        self.finding = False
        self.done = False
        self.redirects = 0
        #: the bootstrap URLs left to ask in this call's find round.
        self.find_left: list[str] = []
        #: why each URL asked in this round gave no answer.
        self.failures: list[str] = []

    def __repr__(self) -> str:
        return (f"RoutedCall({self.api!r}, url={self.url!r}, finding={self.finding}, "
                f"done={self.done})")


@dataclass(frozen=True, slots=True)
class SendCall:
    """Send ``call``'s request to the coordinator at ``url``."""

    call: RoutedCall
    url: str


@dataclass(frozen=True, slots=True)
class AskFind:
    """Ask ``find_coordinator`` of ``url`` for ``call``, bounded by
    :attr:`Routing.find_timeout_ms`."""

    call: RoutedCall
    url: str


@dataclass(frozen=True, slots=True)
class Answer:
    """``call`` is over: its caller gets ``response``."""

    call: RoutedCall
    response: object


@dataclass(frozen=True, slots=True)
class Fail:
    """``call`` is over: its caller gets ``error`` raised (a leg still in
    flight is abandoned)."""

    call: RoutedCall
    error: Exception


@dataclass(frozen=True, slots=True)
class CoordinatorChanged:
    """The group's coordinator is now ``url`` (learned ``how``; ``was``: the one
    announced before). Logged once per change."""

    url: str
    how: str
    was: str | None


@dataclass(frozen=True, slots=True)
class RedirectRefused:
    """``url`` answered ``NOT_COORDINATOR`` naming a URL this member must not use
    (``reason``); the coordinator is unknown again."""

    url: str
    reason: str


RoutingEffect = SendCall | AskFind | Answer | Fail | CoordinatorChanged | RedirectRefused


class Routing:
    """Where a member's calls go, given several coordinators.

    A call goes to the group's current coordinator:

    - none known: with several bootstrap URLs, ``find_coordinator`` is asked
      of each in turn (:meth:`CoordinatorChoice.find_order`), each bounded by
      ``find_timeout_ms``; the first answer decides. One round at a time: a
      call that needs the coordinator while another call's round is under way
      waits for it, then sends to what it found (or asks again itself). A
      server that does not have the call (HTTP 404: a v1 server), or answers
      no error and no URL, is the coordinator itself. With one URL, that URL
      is presumed to be the coordinator.
    - ``NOT_COORDINATOR``: the call goes at once to the owner it names (a URL
      this member may use), or, when it names none, to the one
      ``find_coordinator`` names; at most :data:`MAX_REDIRECTS` times per
      call, then it fails with that error (retriable).
    - a failure to get an answer, or ``COORDINATOR_NOT_AVAILABLE``: the
      coordinator is unknown again; the call ends with it (the member retries
      after its backoff). When another coordinator is found, the calls still
      in flight to the old one fail.
    - ``COORDINATOR_LOAD_IN_PROGRESS``: the owner, still loading; the call
      ends with it (retried there after the member's backoff).
    """

    def __init__(self, bootstrap: Sequence[str], group_id: str, *,
                 find_timeout_ms: int = 5_000) -> None:
        if find_timeout_ms <= 0:
            raise ValueError(f"find_timeout_ms must be positive, got {find_timeout_ms!r}")
        self.choice = CoordinatorChoice(bootstrap)
        self.group_id = group_id
        self.find_timeout_ms = find_timeout_ms
        #: the coordinator last announced (CoordinatorChanged).
        self._announced: str | None = self.choice.current
        #: the call whose find round is under way, and the calls waiting for it.
        self._finder: RoutedCall | None = None
        self._waiting: list[RoutedCall] = []
        #: the calls whose leg to a coordinator is in flight.
        self._sending: list[RoutedCall] = []
        #: per api, the coordinator the last call cancelled while sending went to.
        self._cancelled: dict[str, str] = {}

    # ------------------------------------------------------------ inputs

    def new_call(self, api: str) -> RoutedCall:
        """A call of ``api`` to route (then :meth:`route` it)."""
        self._cancelled.pop(api, None)
        return RoutedCall(api)

    def route(self, call: RoutedCall) -> list[RoutingEffect]:
        """The call is to be sent: its first leg."""
        out: list[RoutingEffect] = []
        self._next_leg(call, out)
        return out

    def answered(self, call: RoutedCall, response: object) -> list[RoutingEffect]:
        """The current leg of ``call`` got ``response``: a
        :class:`~protocol.messages.FindCoordinatorResponse` to ``find_coordinator``,
        else the call's own response."""
        out: list[RoutingEffect] = []
        if call.done:
            return out
        url = call.url
        if call.finding:
            assert isinstance(response, FindCoordinatorResponse), response
            self.choice.answered(url)
            self._found(call, url, response, out)
            return out
        self._unsend(call)
        if getattr(response, "error", None) is ErrorCode.COORDINATOR_NOT_AVAILABLE:
            self.choice.forget(url)  # Kafka's consumer marks the coordinator unknown too
        self._finish(call, out, Answer(call, response))
        return out

    def failed(self, call: RoutedCall, error: Exception) -> list[RoutingEffect]:
        """The current leg of ``call`` got no response: ``error`` (the
        transport's; ``NOT_COORDINATOR`` and ``COORDINATOR_LOAD_IN_PROGRESS``
        as :class:`~client.errors.NotCoordinatorError`)."""
        out: list[RoutingEffect] = []
        if call.done:
            return out
        url = call.url
        if call.finding:
            if not isinstance(error, CoordinatorUnavailableError):
                self._finish(call, out, Fail(call, error))  # fatal (authorization, TLS, ...)
            elif error.http_status == 404:
                # A server without find_coordinator (v1): one process that serves
                # every group.
                self.choice.answered(url)
                self._use(url, "a server without find_coordinator", out)
                self._send(call, url, out)
            else:
                call.failures.append(f"{redact_url(url)}: {error}")
                self._ask_next(call, out)
            return out
        self._unsend(call)
        if isinstance(error, NotCoordinatorError):
            if error.code is not ErrorCode.NOT_COORDINATOR:
                # loading: the owner; retried there after the member's backoff
                self._finish(call, out, Fail(call, error))
                return out
            self._redirect(url, error.owner_url, out)
            call.redirects += 1
            if call.redirects > MAX_REDIRECTS:
                self._finish(call, out, Fail(call, error))
            else:
                self._next_leg(call, out)
            return out
        if isinstance(error, CoordinatorUnavailableError):
            self.choice.forget(url)
        self._finish(call, out, Fail(call, error))
        return out

    def find_timed_out(self, call: RoutedCall) -> list[RoutingEffect]:
        """The ``find_coordinator`` leg of ``call`` got no answer within
        ``find_timeout_ms`` (the driver abandons it)."""
        out: list[RoutingEffect] = []
        if call.done or not call.finding:
            return out
        call.failures.append(f"{redact_url(call.url)}: no answer within "
                             f"{self.find_timeout_ms} ms")
        self._ask_next(call, out)
        return out

    def cancelled(self, call: RoutedCall) -> list[RoutingEffect]:
        """The caller gave ``call`` up (its timeout, its process going): the call
        is over; a find round it had under way ends (a call waiting for it asks
        itself)."""
        out: list[RoutingEffect] = []
        if call.done:
            return out
        if call in self._sending:
            self._cancelled[call.api] = call.url
        self._unsend(call)
        self._finish(call, out, None)
        return out

    def timed_out(self, api: str) -> None:
        """The member's last ``api`` call got no answer within its timeout (a
        paused process, a black hole): if it was sent to a coordinator, that one
        is given up. Even if it answered other calls since: those may have been
        answered just before it stopped, and a coordinator still serving is found
        again at the cost of one ``find_coordinator``."""
        url = self._cancelled.pop(api, None)
        if url is not None:
            self.choice.forget(url)

    # ------------------------------------------------------------ decisions

    def _next_leg(self, call: RoutedCall, out: list[RoutingEffect]) -> None:
        """To the current coordinator; none known: find it (or wait for the
        round under way)."""
        current = self.choice.current
        if current is not None:
            self._send(call, current, out)
        elif self._finder is not None:
            call.finding = False
            self._waiting.append(call)
        else:
            self._start_find(call, out)

    def _start_find(self, call: RoutedCall, out: list[RoutingEffect]) -> None:
        urls = self.choice.bootstrap
        if len(urls) == 1:
            self._use(urls[0], "the only URL given", out)
            self._send(call, urls[0], out)
            return
        self._finder = call
        call.failures = []
        call.find_left = self.choice.find_order()
        self._ask_next(call, out)

    def _ask_next(self, call: RoutedCall, out: list[RoutingEffect]) -> None:
        if not call.find_left:
            self.choice.none_answered()
            self._fail(call, out, CoordinatorUnavailableError(
                f"{call.api}: find_coordinator for group {self.group_id!r} got no answer: "
                + "; ".join(call.failures)))
            return
        url = call.find_left.pop(0)
        call.url = url
        call.finding = True
        out.append(AskFind(call, url))

    def _found(self, call: RoutedCall, asked: str, response: FindCoordinatorResponse,
               out: list[RoutingEffect]) -> None:
        try:
            owner = self.choice.found_target(asked, response)
        except CoordinatorUnavailableError:
            assert response.error is not None
            self._fail(call, out, CoordinatorUnavailableError(
                f"{call.api}: no coordinator serves group {self.group_id!r} now "
                f"(find_coordinator at {redact_url(asked)}: {response.error.value})"))
            return
        if not response.url:
            self._use(asked, f"find_coordinator at {redact_url(asked)} named itself", out)
            self._send(call, asked, out)
            return
        try:
            self.choice.check_named(owner)
        except ValueError as exc:
            self._fail(call, out, CoordinatorUnavailableError(
                f"{call.api}: find_coordinator at {redact_url(asked)} named an unusable "
                f"coordinator URL: {exc}"))
            return
        self._use(owner, f"find_coordinator at {redact_url(asked)}", out)
        self._send(call, owner, out)

    def _redirect(self, url: str, owner: str, out: list[RoutingEffect]) -> None:
        """``url`` answered NOT_COORDINATOR naming ``owner`` (or nobody)."""
        choice = self.choice
        target = choice.redirect_target(url, owner)
        if target == "":
            return  # another call moved on already
        if target is None:
            choice.forget(url)
            return
        try:
            choice.check_named(target)
        except ValueError as exc:
            out.append(RedirectRefused(url, str(exc)))
            choice.forget(url)
            return
        self._use(target, f"NOT_COORDINATOR from {redact_url(url)}", out)

    def _use(self, url: str, how: str, out: list[RoutingEffect]) -> None:
        self.choice.current = url
        # The calls in flight to another coordinator fail now (Kafka's client
        # fails the requests in flight to a coordinator it marks dead); found
        # again, the same coordinator keeps its calls.
        for other in [c for c in self._sending if c.url != url]:
            self._unsend(other)
            self._fail(other, out, CoordinatorUnavailableError(
                f"{other.api}: gave up waiting on {redact_url(other.url)}: the group's "
                "coordinator changed or stopped answering", url=redact_url(other.url)))
        if url != self._announced:
            was = self._announced
            self._announced = url
            out.append(CoordinatorChanged(url, how, was))

    def _send(self, call: RoutedCall, url: str, out: list[RoutingEffect]) -> None:
        call.url = url
        call.finding = False
        self._sending.append(call)
        out.append(SendCall(call, url))
        if self._finder is call:
            self._end_round(out)

    def _unsend(self, call: RoutedCall) -> None:
        if call in self._sending:
            self._sending.remove(call)

    def _fail(self, call: RoutedCall, out: list[RoutingEffect], error: Exception) -> None:
        self._finish(call, out, Fail(call, error))

    def _finish(self, call: RoutedCall, out: list[RoutingEffect],
                outcome: Answer | Fail | None) -> None:
        """``call`` is over (``outcome`` None: its caller gave it up)."""
        call.done = True
        call.finding = False
        if call in self._waiting:
            self._waiting.remove(call)
        if outcome is not None:
            out.append(outcome)
        if self._finder is call:
            self._end_round(out)

    def _end_round(self, out: list[RoutingEffect]) -> None:
        """The find round under way ended: the calls that waited for it go on,
        to what it found, or the first of them asks again."""
        self._finder = None
        while self._waiting and self._finder is None:
            waiter = self._waiting.pop(0)
            self._next_leg(waiter, out)
