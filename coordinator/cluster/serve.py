"""``groupcoord serve --db postgresql://...``: one coordinator among several.

Start-up: open the database twice (writes; loads and admin reads) and migrate
it, with ``--partitions`` checked against it; listen (the protocol calls
answer ``NOT_COORDINATOR`` until partitions are owned); check that the
advertised URL reaches this process (else exit 2 naming it); register with
the advertised URL and take this coordinator's share of the free partitions;
print the ``admin listening on`` and ``listening on`` lines. SIGTERM or
SIGINT: hand every partition off (writes finished, leases released) so the
others take them over at once, then exit 0. A database that cannot be
reached at start exits 2 with one line naming it (never its password); once
running, losing the database only costs the partitions whose leases run out
(docs/operations.md, "Running several coordinators").
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
import uuid
from urllib.parse import urlsplit

from coordinator.config import ServerConfig

log = logging.getLogger("groupcoord.serve")

EXIT_CONFIG = 2
SHUTDOWN_GRACE_S = 2.0


def admin_url_for_others(bound: str, advertised: str) -> str:
    """Where the other coordinators forward admin calls about this one's groups: the
    admin listener as bound, or, when it listens on every address (0.0.0.0, ::), on
    the advertised URL's host."""
    parts = urlsplit(bound)
    if parts.hostname not in ("0.0.0.0", "::"):
        return bound
    host = urlsplit(advertised).hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}:{parts.port}"


async def serve_cluster(config: ServerConfig, *, ready_line: bool = True) -> int:
    from coordinator import auth, tls
    from coordinator.cluster.host import (
        PartitionHost,
        lease_settings,
        number_ranges,
        writer_settings,
    )
    from coordinator.cluster.service import ClusterService
    from coordinator.core import GroupCoordinator
    from coordinator.http.headers import admin_names
    from coordinator.http.listeners import ListenError, Listeners
    from coordinator.metrics import Metrics
    from coordinator.runtime.clock import WallClock
    from coordinator.storage import pgurl
    from coordinator.storage.leases import Leases
    from coordinator.storage.postgres import PostgresStorage
    from coordinator.storage.sqlite import StorageError

    coordinator_id = uuid.uuid4().hex[:12]
    tokens = None
    ssl_context = None
    opened: list[PostgresStorage] = []
    try:
        if config.auth_tokens:
            tokens = auth.TokenStore.load(config.auth_tokens)
        if config.tls_cert:
            ssl_context = tls.server_ssl_context(config.tls_cert, config.tls_key or None)
        writer = await PostgresStorage.open(config.db, partitions=config.partitions or None,
                                            coordinator_id=coordinator_id,
                                            settings=writer_settings(config.lease_ms))
        opened.append(writer)
        reader = await PostgresStorage.open(config.db, partitions=writer.partitions,
                                            coordinator_id=coordinator_id)
        opened.append(reader)
    except (auth.TokenFileError, tls.TLSConfigError, StorageError) as exc:
        for store in opened:
            await store.close()
        print(f"groupcoord serve: {pgurl.scrub(str(exc), config.db)}", file=sys.stderr)
        return EXIT_CONFIG
    for address in dict.fromkeys((config.host, config.admin_address)):
        if (warning := auth.startup_warning(address, tokens is not None)) is not None:
            log.warning("%s", warning)

    core_config = config.core_config()
    metrics = Metrics()
    clock = WallClock()
    leases: Leases | None = None
    status = 0
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    listeners: Listeners | None = None
    host: PartitionHost | None = None
    runner: asyncio.Task[None] | None = None
    try:
        # The URLs are known once listening (--port 0 picks one): the host is made
        # first and told them before it registers.
        try:
            leases = await Leases.open(config.db, coordinator_id, "",
                                       settings=lease_settings(config.lease_ms))
        except StorageError as exc:
            print(f"groupcoord serve: {pgurl.scrub(str(exc), config.db)}", file=sys.stderr)
            return EXIT_CONFIG
        host = PartitionHost(writer_store=writer, reader_store=reader, leases=leases,
                             lease_ms=config.lease_ms,
                             make_core=lambda: GroupCoordinator(core_config),
                             clock=clock, metrics=metrics,
                             max_parked_requests=config.max_parked_requests,
                             max_parked_per_token=config.max_parked_per_token)
        service = ClusterService(host)
        metrics.watch_core(service.core.state_counts, service.core.member_count,
                           service.core.drain_counts)
        metrics.watch_groups(service.local_groups,
                             lambda group_id: service.core.health(group_id,
                                                                  clock.now_ms()).status,
                             config.group_metrics, service.core.describe_group)
        listeners = Listeners(service, metrics, max_body_bytes=config.max_body_bytes,
                              max_metadata_bytes=config.max_metadata_bytes, tokens=tokens,
                              admin_names=admin_names(config.admin_address,
                                                      config.advertised_url,
                                                      config.admin_allowed_host_names),
                              console_limits=config.console_limits())
        protocol, admin = await listeners.start(config.host, config.port,
                                                config.admin_address, config.admin_port,
                                                ssl_context)
        host.url = leases.advertised_url = config.advertised_url or protocol.url
        # Before registering: find_coordinator and NOT_COORDINATOR will send groups
        # there, so it must lead to this process (ListenError if not).
        await listeners.check_reaches_self(host.url)
        leases.admin_url = admin_url_for_others(admin.url, host.url)
        await host.start()
        runner = asyncio.ensure_future(host.run())
        gc.freeze()
        owned = sorted(host.partitions)
        log.info("ready: coordinator %s of %s (%d partitions, lease %d ms), serving as %s, "
                 "admin on %s; owns %d partition(s) so far (%s), %d group(s) loaded",
                 coordinator_id, pgurl.redact(config.db), host.partition_count,
                 config.lease_ms, host.url, admin.url, len(owned),
                 number_ranges(owned) or "none", len(service.local_groups()))
        if ready_line:
            print(f"admin listening on {admin.url}", flush=True)
            print(f"listening on {protocol.url}", flush=True)
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({stopped, runner}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if runner.done() and not stop.is_set():
            log.critical("the lease loop failed: %r", runner.exception())
            status = 1
        else:
            log.info("shutting down: handing partitions off")
    except ListenError as exc:
        print(f"groupcoord serve: {exc}", file=sys.stderr)
        status = EXIT_CONFIG
    except StorageError as exc:
        print(f"groupcoord serve: {pgurl.scrub(str(exc), config.db)}", file=sys.stderr)
        status = EXIT_CONFIG
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if listeners is not None:
            listeners.close()
        if host is not None:
            await host.stop()
        if runner is not None:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await runner
        if listeners is not None:
            await listeners.stop(SHUTDOWN_GRACE_S)
        if leases is not None:
            await leases.close()
        for store in opened:
            await store.close()
    return status
