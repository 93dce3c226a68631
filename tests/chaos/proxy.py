"""A TCP fault proxy for the chaos harness: latency, refusals, cuts and partitions.

Workers talk to the coordinator through this proxy instead of directly, so the
harness can break the network between them without root (no ``tc``/iptables):

* ``set_latency(ms, jitter_ms)`` -- every chunk, each direction, is delivered
  that much later (order kept: a chunk never overtakes an earlier one).
* ``refuse_new(True)`` -- new connections are reset at once (a crashed host
  or a closed port: the client sees a connection error straight away).
* ``cut_all()`` -- every open connection is reset (a middlebox dropping state).
* ``partition(seconds, cut=False)`` -- nothing flows for that long: open
  connections stall and new ones hang before reaching the server; then traffic
  resumes and what was sent meanwhile is delivered late, as TCP's
  retransmissions would do after a short partition. With ``cut=True`` every
  connection is reset instead when the partition heals (a long partition that
  outlived TCP's retransmission timeout).

Runs in the event loop of whoever uses it (a test, or the chaos runner's own
loop); ``python tests/chaos/proxy.py UPSTREAM_PORT`` runs one standalone.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
from dataclasses import dataclass

__all__ = ["FaultProxy", "ProxyStats"]

_CHUNK = 64 * 1024


@dataclass
class ProxyStats:
    accepted: int = 0
    refused: int = 0
    cut: int = 0
    upstream_failures: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    partitions: int = 0


class _Conn:
    """One proxied connection: a client socket and, once connected, the upstream one."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[bool]] = []

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Listens on ``listen_host:listen_port`` (0: a free port) and forwards upstream."""

    def __init__(self, upstream_host: str, upstream_port: int, *,
                 listen_host: str = "127.0.0.1", listen_port: int = 0,
                 seed: int | None = None) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.listen_host = listen_host
        self._listen_port = listen_port
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._latency_s = 0.0
        self._jitter_s = 0.0
        self._refusing = False
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._heal_task: asyncio.Task[None] | None = None
        self._rng = random.Random(seed)
        self.stats = ProxyStats()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host,
                                                  self._listen_port)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("proxy not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        return f"http://{self.listen_host}:{self.port}"

    async def stop(self) -> None:
        if self._heal_task is not None:
            self._heal_task.cancel()
        if self._server is not None:
            self._server.close()
        self.cut_all(count=False)
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def set_upstream(self, host: str, port: int) -> None:
        """New connections go there (the coordinator restarted on another port)."""
        self.upstream_host, self.upstream_port = host, port

    # ------------------------------------------------------------ faults

    def set_latency(self, ms: float, jitter_ms: float = 0.0) -> None:
        """Delay every chunk by ``ms`` plus up to ``jitter_ms`` more, each way."""
        if ms < 0 or jitter_ms < 0:
            raise ValueError("latency and jitter must be >= 0")
        self._latency_s = ms / 1000
        self._jitter_s = jitter_ms / 1000

    def refuse_new(self, refuse: bool = True) -> None:
        self._refusing = refuse

    def cut_all(self, *, count: bool = True) -> int:
        """Reset every open connection; returns how many were cut."""
        conns = list(self._conns)
        for conn in conns:
            conn.abort()
        self._conns.clear()
        if count:
            self.stats.cut += len(conns)
        return len(conns)

    def partition(self, seconds: float, *, cut: bool = False) -> None:
        """Stop all traffic for ``seconds``; see the module docstring."""
        if seconds < 0:
            raise ValueError("a partition lasts >= 0 seconds")
        self.stats.partitions += 1
        self._flowing.clear()
        if self._heal_task is not None:
            self._heal_task.cancel()
        self._heal_task = asyncio.get_running_loop().create_task(self._heal_after(seconds, cut))

    def heal(self, *, cut: bool = False) -> None:
        """End a partition now."""
        if self._heal_task is not None:
            self._heal_task.cancel()
            self._heal_task = None
        if cut:
            self.cut_all()
        self._flowing.set()

    @property
    def partitioned(self) -> bool:
        return not self._flowing.is_set()

    def reset_faults(self) -> None:
        self.set_latency(0)
        self.refuse_new(False)
        self.heal()

    async def _heal_after(self, seconds: float, cut: bool) -> None:
        await asyncio.sleep(seconds)
        self._heal_task = None
        self.heal(cut=cut)

    # ------------------------------------------------------------ forwarding

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._handlers.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            self.stats.refused += 1
            writer.transport.abort()  # RST, as a closed port would answer
            return
        self.stats.accepted += 1
        conn = _Conn(writer)
        self._conns.add(conn)
        try:
            # A partitioned network: the SYN gets no further than this proxy.
            await self._flowing.wait()
            if conn not in self._conns:  # cut while waiting
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(self.upstream_host,
                                                                     self.upstream_port)
            except OSError:
                self.stats.upstream_failures += 1
                writer.transport.abort()
                return
            conn.upstream = up_writer
            if conn not in self._conns:
                up_writer.transport.abort()
                return
            conn.tasks = [
                asyncio.create_task(self._pipe(reader, up_writer, up=True)),
                asyncio.create_task(self._pipe(up_reader, writer, up=False)),
            ]
            # A clean half-close (EOF) waits for the other direction; a reset on
            # either side resets the other, as it would end a real connection.
            pending: set[asyncio.Task[bool]] = set(conn.tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if not all(not t.cancelled() and t.result() for t in done):
                    break
        finally:
            self._conns.discard(conn)
            conn.abort()

    def _delay(self) -> float:
        if self._jitter_s:
            return self._latency_s + self._rng.uniform(0, self._jitter_s)
        return self._latency_s

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *,
                    up: bool) -> bool:
        """Copy ``src`` to ``dst``, each chunk released at its own deadline.

        Returns True after a clean end of stream, False after a reset.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._flowing.wait()
                if not data:
                    with contextlib.suppress(OSError, RuntimeError):
                        dst.write_eof()
                    return
                dst.write(data)
                await dst.drain()
                if up:
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)

        writer_task = asyncio.create_task(deliver())
        try:
            while True:
                data = await src.read(_CHUNK)
                await self._flowing.wait()  # nothing is read off the wire in a partition
                queue.put_nowait((loop.time() + self._delay(), data))
                if not data:
                    break
            await writer_task
            return True
        except (OSError, asyncio.IncompleteReadError):
            return False
        finally:
            writer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await writer_task


async def _main(upstream_port: int, listen_port: int) -> None:
    async with FaultProxy("127.0.0.1", upstream_port, listen_port=listen_port) as proxy:
        print(f"listening on {proxy.url} -> 127.0.0.1:{upstream_port}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0))
