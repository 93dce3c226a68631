"""``groupcoord serve``: run the coordinator (docs/protocol.md, "Running the server").

Start-up order: open (and migrate) the database, listen on the protocol and
admin listeners (:mod:`coordinator.http.listeners`) — ``/healthz`` answers and
protocol calls get ``COORDINATOR_LOAD_IN_PROGRESS`` — check that the URL
``find_coordinator`` gives out reaches this process (else exit 2 naming it),
load the snapshot and restore the core, then mark ready and print ``admin listening on
http://HOST:PORT`` and, last, ``listening on http://HOST:PORT`` (the protocol
listener). SIGTERM or SIGINT: stop the runtime (parked requests answered
``COORDINATOR_NOT_AVAILABLE``, pending writes committed), close the listeners
and the database, exit 0. A storage failure exits 1 (see runtime docs).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys

from coordinator.config import SETTINGS, ConfigError, ServerConfig, resolve

log = logging.getLogger("groupcoord.serve")

#: seconds open connections get to finish after the runtime stopped.
SHUTDOWN_GRACE_S = 2.0
EXIT_CONFIG = 2
EXIT_STORAGE = 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = ServerConfig()
    parser = subparsers.add_parser(
        "serve", help="run the coordinator server",
        description="Run the group coordinator. Every setting is also a GROUPCOORD_* "
                    "environment variable and a key of the --config TOML file "
                    "(precedence: flag > environment > file > default).")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="TOML file of settings (env GROUPCOORD_CONFIG)")
    for setting in SETTINGS:
        default = getattr(defaults, setting.name)
        parser.add_argument(setting.flag, dest=setting.name, default=None,
                            metavar=setting.name.upper(),
                            help=f"{setting.help} (env {setting.env}; default {default!r})")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    flags = {s.name: getattr(args, s.name) for s in SETTINGS}
    try:
        config = resolve(flags, os.environ, args.config)
    except ConfigError as exc:
        print(f"groupcoord serve: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop
    except ImportError:  # optional: the default loop works the same, a little slower
        return asyncio.run(serve(config))
    return uvloop.run(serve(config))


async def serve(config: ServerConfig, *, ready_line: bool = True) -> int:
    from coordinator.storage import pgurl
    if pgurl.is_postgres_url(config.db):
        from coordinator.cluster.serve import serve_cluster
        return await serve_cluster(config, ready_line=ready_line)
    # Heavy imports here, not at module level: `groupcoord --help` stays fast.
    from coordinator import auth, tls
    from coordinator.core import GroupCoordinator
    from coordinator.http.headers import admin_names
    from coordinator.http.listeners import ListenError, Listeners
    from coordinator.metrics import Metrics
    from coordinator.runtime.clock import WallClock
    from coordinator.runtime.runtime import Runtime
    from coordinator.storage.sqlite import Storage, StorageError

    tokens = None
    ssl_context = None
    try:
        if config.auth_tokens:
            tokens = auth.TokenStore.load(config.auth_tokens)
        if config.tls_cert:
            ssl_context = tls.server_ssl_context(config.tls_cert, config.tls_key or None)
        storage = await Storage.open(config.db)
    except (auth.TokenFileError, tls.TLSConfigError, StorageError) as exc:
        print(f"groupcoord serve: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    for host in dict.fromkeys((config.host, config.admin_address)):
        if (warning := auth.startup_warning(host, tokens is not None)) is not None:
            log.warning("%s", warning)

    core = GroupCoordinator(config.core_config())
    metrics = Metrics()
    metrics.watch_core(core.state_counts, core.member_count, core.drain_counts)
    clock = WallClock()
    metrics.watch_groups(core.list_groups,
                         lambda group_id: core.health(group_id, clock.now_ms()).status,
                         config.group_metrics, core.describe_group)
    runtime = Runtime(core, storage, clock, metrics,
                      max_parked_requests=config.max_parked_requests,
                      max_parked_per_token=config.max_parked_per_token)
    listeners = Listeners(runtime, metrics, max_body_bytes=config.max_body_bytes,
                          max_metadata_bytes=config.max_metadata_bytes, tokens=tokens,
                          admin_names=admin_names(config.admin_address, config.advertised_url,
                                                  config.admin_allowed_host_names),
                          console_limits=config.console_limits())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    status = 0
    try:
        # What was actually bound (``--port 0`` picks a port).
        protocol, admin = await listeners.start(config.host, config.port,
                                                config.admin_address, config.admin_port,
                                                ssl_context)
        advertised_url = config.advertised_url or protocol.url
        # find_coordinator gives it out: it must lead here (ListenError if not).
        await listeners.check_reaches_self(advertised_url)
        await runtime.start()
        # Everything alive now (modules, the restored groups) lives as long as the
        # process: keep it out of the cyclic GC's full scans, which would otherwise
        # walk it on every gen-2 collection and show up as latency spikes.
        gc.freeze()
        scheme = protocol.scheme
        host, port = config.host, protocol.port
        runtime.advertised_url = advertised_url
        admin_url = f"{scheme}://{config.admin_address}:{admin.port}"
        log.info("ready: database %s, listening on %s://%s:%d, admin on %s", config.db,
                 scheme, host, port, admin_url)
        if ready_line:
            # The admin line first: the protocol line stays the last, "ready" one.
            print(f"admin listening on {admin_url}", flush=True)
            print(f"listening on {scheme}://{host}:{port}", flush=True)
        failed = asyncio.ensure_future(runtime.failed.wait())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({failed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        failed.cancel()
        stopped.cancel()
        if runtime.failed.is_set():
            status = EXIT_STORAGE
            log.critical("exiting after a storage failure; restart to reload from %s",
                         config.db)
        else:
            log.info("shutting down")
    except ListenError as exc:
        print(f"groupcoord serve: {exc}", file=sys.stderr)
        status = EXIT_CONFIG
    except StorageError as exc:
        # Storage.load found a row it cannot decode: nothing was restored or served.
        print(f"groupcoord serve: {exc}", file=sys.stderr)
        status = EXIT_CONFIG
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        # No new connections; parked requests answered COORDINATOR_NOT_AVAILABLE;
        # protocol connections answer what is in flight and close; then the admin's.
        listeners.close()
        await runtime.stop()
        await listeners.stop(SHUTDOWN_GRACE_S)
        await storage.close()
    return status

