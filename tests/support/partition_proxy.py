"""A TCP forwarder between one client (a serve process) and Redis that can be cut: the soak's
``proc_partition`` fault (bench/soak_faults.py) and tests/e2e/test_partition.py.

While partitioned it forwards nothing either way: what either side sent waits, and arrives
once the partition heals, as TCP retransmits across a partition that ends before its own
timeout. It emulates what the client's kernel does with data it sent during the cut:
- the client closed the connection normally (FIN) meanwhile: its data still reaches Redis
  after the heal, and runs then, though the client gave up on it long before (a real kernel
  keeps retransmitting what it sent before the FIN);
- the client aborted the connection (RST, SO_LINGER 0): its data is dropped (a real kernel
  discards unacknowledged data on an abortive close).
A new connection during the cut is accepted (on loopback the kernel completes the handshake)
and joined to Redis only once healed: the client's first commands on it wait, where across a
real partition its connect would time out first.

Hand-written rather than toxiproxy: ~70 lines in the test's own process, no binary to install,
and a pause that holds data instead of dropping it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import threading
from collections.abc import Iterator

HOST = "127.0.0.1"
CHUNK = 65536


@contextlib.contextmanager
def forwarding(redis_port: int) -> Iterator[PartitionProxy]:
    """A started forwarder to the Redis on ``redis_port`` of 127.0.0.1, stopped on the way out."""
    proxy = PartitionProxy(HOST, redis_port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


class PartitionProxy:
    """``redis://127.0.0.1:<port>`` forwarded to ``target``; ``partition()`` and ``heal()``
    from any thread."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0  # the port start() is given by the kernel: no other process can take it
        self._loop = asyncio.new_event_loop()
        self._healed = asyncio.Event()
        self._healed.set()
        self._server: asyncio.Server | None = None
        self.joined = 0  # connections joined to Redis and not yet closed on both sides
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="partition-proxy")

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> PartitionProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._join, HOST, 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def partition(self) -> None:
        """In effect when this returns: nothing sent afterwards goes through."""
        async def cut() -> None:
            self._healed.clear()
        asyncio.run_coroutine_threadsafe(cut(), self._loop).result(10)

    def heal(self) -> None:
        async def heal() -> None:
            # A few turns of the loop first: each polls the sockets, so what happened during
            # the cut (a client's reset) is taken in before anything held is sent on.
            for _ in range(3):
                await asyncio.sleep(0)
            self._healed.set()
        asyncio.run_coroutine_threadsafe(heal(), self._loop).result(10)

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            joins = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for join in joins:  # each closes its sockets on the way out
                join.cancel()
            await asyncio.gather(*joins, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _join(self, client_in: asyncio.StreamReader,
                    client_out: asyncio.StreamWriter) -> None:
        try:
            await self._healed.wait()
            redis_in, redis_out = await asyncio.open_connection(*self.target)
        except OSError:  # Redis is down (a restart fault): as a refused connection would
            client_out.close()
            return
        except asyncio.CancelledError:  # stop() during a partition: quietly (a server callback)
            client_out.close()
            return
        self.joined += 1
        try:
            await asyncio.gather(self._pump(client_in, redis_out, client_out),
                                 self._pump(redis_in, client_out, redis_out))
        except asyncio.CancelledError:  # stop(): each pump closed its side on the way out
            pass
        finally:
            self.joined -= 1

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                    source_end: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._healed.wait()
                data = await source.read(CHUNK)
                if not data:
                    break
                if not self._healed.is_set():
                    # Sent during the cut: unacknowledged, it waits in the sender's kernel,
                    # which drops it if the sender resets the connection before the heal.
                    await self._healed.wait()
                    if _was_reset(source, source_end):
                        break
                sink.write(data)
                await sink.drain()
        except OSError:  # the other side went away (a kill, a restart): close this one too
            pass
        finally:
            sink.close()


def _was_reset(source: asyncio.StreamReader, end: asyncio.StreamWriter) -> bool:
    """Whether the sender reset the connection: seen by the stream, or still pending on the
    socket (the stream stops reading once its buffer is full, and so may not have seen it)."""
    if isinstance(source.exception(), ConnectionResetError):
        return True
    sock = end.transport.get_extra_info("socket")
    try:
        return sock is not None and \
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET
    except OSError:  # closed meanwhile: the stream's exception above is the word on it
        return False
