"""A TCP proxy between the app and its database that cuts a connection at a chosen statement.

Armed, it watches what each client sends; at the trigger (a pattern in the client's bytes, once
another has passed on that connection when ``after`` is given) it either drops the request (the
server never sees it) or forwards it and drops the server's reply ("commit outcome unknown": the
server executed and committed it, the client cannot know). Both sides of that connection are then
reset. Or it forwards the request and delays the server's reply ``hold`` seconds, then delivers it
and goes on (``mode="delay"``: a slow network, an fsync before the reply; issue 50). A
:meth:`~FaultProxy.blackhole` silences connections without closing them (issue 39).
Plain threads and sockets; the wire protocols (PostgreSQL's, MySQL's) carry the SQL text,
which is all it reads.
"""

from __future__ import annotations

import contextlib
import queue
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: The result write of a two-phase view: the only statement that sets ``response_body``.
RESULT_WRITE = rb"response_body"
#: The commit that ends an atomic view's transaction (after its result write).
COMMIT = rb"(?i)\bcommit\b"


@dataclass
class _Pair:
    client: socket.socket
    server: socket.socket
    after_seen: bool = False
    tail: bytes = b""
    cut_on_reply: bool = False
    closed: bool = False
    #: Blackholed: what either side sends is dropped, and nothing is closed.
    silent: bool = False
    #: Seconds a cut connection stays silent before it is reset (:meth:`FaultProxy.arm`).
    hold: float = 0.0
    #: Seconds the server's next reply waits before it is delivered (``mode="delay"``).
    delay_reply: float = 0.0


@dataclass
class Trigger:
    mode: str  # "request", "reply" or "delay"
    pattern: re.Pattern[bytes]
    after: re.Pattern[bytes] | None
    remaining: int
    fired: int = 0
    hold: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)


class FaultProxy:
    """Listen on ``port`` (loopback), forward to ``upstream_port``; :meth:`arm` a cut."""

    def __init__(
        self, port: int, upstream_port: int, upstream_host: str = "127.0.0.1", lag: float = 0.0
    ) -> None:
        self.port = port
        #: Seconds each of the server's bytes takes to reach the client: a delay line, not a
        #: throttle (the distance between two machines; a standby's stream, issue 51).
        self.lag = lag
        self.upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._trigger: Trigger | None = None
        self._silent = False
        self._listener = socket.create_server(("127.0.0.1", port), backlog=256)
        self._refusing = False
        #: When (``time.monotonic()``) each connection refused since :meth:`refuse` came.
        self.refused: list[float] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut_all()
        self._thread.join(timeout=5)

    # Faults -----------------------------------------------------------------------------------

    def arm(
        self,
        mode: str,
        pattern: bytes,
        *,
        after: bytes | None = None,
        count: int,
        hold: float = 0.0,
    ) -> Trigger:
        """Cut the next ``count`` connections that send ``pattern`` (after ``after``), dropping
        the request (``mode="request"``) or the reply (``mode="reply"``); with ``hold``, the
        connection stays silent that many seconds before it is reset (issue 39). With
        ``mode="delay"`` nothing is cut: the server's reply to the request is held ``hold``
        seconds, then delivered, and the connection goes on (issue 50)."""
        assert mode in ("request", "reply", "delay")
        trigger = Trigger(
            mode,
            re.compile(pattern),
            re.compile(after) if after else None,
            remaining=count,
            hold=hold,
        )
        with self._lock:
            self._trigger = trigger
        return trigger

    def disarm(self) -> int:
        """Stop cutting; how many cuts the last trigger made."""
        with self._lock:
            trigger, self._trigger = self._trigger, None
        return trigger.fired if trigger else 0

    def blackhole(self, *, new: bool = True) -> int:
        """Go silent as a blackholed network does (a failover that moved an IP, a dropped NAT
        entry): every open connection stops forwarding for good, its sockets left open (no
        reset, no close: each side waits); with ``new``, so do the connections made until
        :meth:`restore`. How many were open."""
        with self._lock:
            self._silent = new
            pairs = [pair for pair in self._pairs if not pair.closed]
            for pair in pairs:
                pair.silent = True
        return len(pairs)

    def restore(self) -> int:
        """New connections are forwarded again (the silenced ones stay silent): how many
        silenced connections are still open (their clients have not given them up)."""
        with self._lock:
            self._silent = False
            return sum(1 for pair in self._pairs if pair.silent and not pair.closed)

    def heal(self) -> int:
        """The partition over, as the checker's nemesis ends a blackhole: new connections are
        forwarded again, and each silenced one is reset, as the far side resets the first
        retransmission after a dropped NAT entry or a moved IP (it holds no such connection).
        Left silent (:meth:`restore`), a connection waited for good: this proxy's kernel had
        acknowledged every byte, so no TCP timeout on the client's side ever ended it, which
        no real partition does. How many were reset."""
        with self._lock:
            self._silent = False
            pairs = [pair for pair in self._pairs if pair.silent and not pair.closed]
        for pair in pairs:
            self._close(pair)
        return len(pairs)

    def refuse(self) -> int:
        """Go away as a server that stops does: reset every open connection, and every new one
        until :meth:`admit` (issue 39); how many were open."""
        with self._lock:
            self._refusing = True
            self.refused = []
        return self.cut_all()

    def admit(self) -> None:
        """Take connections again, as a server back up does."""
        with self._lock:
            self._refusing = False

    def repoint(self, upstream_port: int) -> int:
        """Forward new connections to ``upstream_port`` (a failover's new primary) and reset
        every open one, which reached the old server: how many."""
        with self._lock:
            self.upstream = (self.upstream[0], upstream_port)
        return self.cut_all()

    def cut_all(self) -> int:
        """Reset every open connection at once, as a network failure does: how many."""
        with self._lock:
            pairs = [pair for pair in self._pairs if not pair.closed]
        for pair in pairs:
            self._close(pair)
        return len(pairs)

    # Plumbing ---------------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refusing = self._refusing
                if refusing:
                    self.refused.append(time.monotonic())
            if refusing:  # at once, here: no thread for a connection refused
                _reset(client)
                continue
            # Connecting upstream in a thread of its own: a slow server must not hold the
            # accept loop (nor an error end it).
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        with self._lock:
            upstream = self.upstream
        try:
            server = socket.create_connection(upstream, timeout=5)
        except OSError:
            # The server is down: refuse as it would (a reset, not a hang).
            _reset(client)
            return
        pair = _Pair(client, server, silent=self._silent)
        try:
            server.settimeout(None)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            self._close(pair)
            return
        with self._lock:
            self._pairs = [p for p in self._pairs if not p.closed]
            self._pairs.append(pair)
        threading.Thread(target=self._pump, args=(pair, self._upstream), daemon=True).start()
        downstream = self._lagging if self.lag else self._downstream
        threading.Thread(target=self._pump, args=(pair, downstream), daemon=True).start()

    def _pump(self, pair: _Pair, direction: Callable[[_Pair], None]) -> None:
        """Whatever ends one direction (an error included) resets both: no side is left
        waiting for bytes that will never come."""
        try:
            direction(pair)
        finally:
            self._close(pair)

    def _upstream(self, pair: _Pair) -> None:
        """Client to server: where the trigger looks."""
        while True:
            try:
                chunk = pair.client.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                self._close(pair)
                return
            if pair.silent:
                continue
            action = self._check(pair, chunk)
            if action == "request":
                time.sleep(pair.hold)
                self._close(pair)
                return
            try:
                pair.server.sendall(chunk)
            except OSError:
                self._close(pair)
                return

    def _downstream(self, pair: _Pair) -> None:
        while True:
            try:
                chunk = pair.server.recv(65536)
            except OSError:
                chunk = b""
            if not chunk or pair.cut_on_reply:
                if chunk:
                    time.sleep(pair.hold)
                self._close(pair)
                return
            if pair.silent:
                continue
            if pair.delay_reply:
                # What came is the reply's first bytes (the request went after the flag was set).
                delay, pair.delay_reply = pair.delay_reply, 0.0
                time.sleep(delay)
            try:
                pair.client.sendall(chunk)
            except OSError:
                self._close(pair)
                return

    def _lagging(self, pair: _Pair) -> None:
        """Server to client, each chunk delivered :attr:`lag` seconds after it came (no
        faults: a proxy with a lag only stands for a distance)."""
        line: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

        def deliver() -> None:
            while True:
                due, chunk = line.get()
                if not chunk:
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                try:
                    pair.client.sendall(chunk)
                except OSError:
                    self._close(pair)
                    return

        sender = threading.Thread(target=deliver, daemon=True)
        sender.start()
        while True:
            try:
                chunk = pair.server.recv(65536)
            except OSError:
                chunk = b""
            line.put((time.monotonic() + self.lag, chunk))
            if not chunk:
                sender.join()
                return

    def _check(self, pair: _Pair, chunk: bytes) -> str | None:
        with self._lock:
            trigger = self._trigger
            if trigger is None or trigger.remaining <= 0:
                return None
            window = pair.tail + chunk
            pair.tail = chunk[-64:]
            start = len(window) - len(chunk)
            if trigger.after is not None and not pair.after_seen:
                if not any(m.end() > start for m in trigger.after.finditer(window)):
                    return None
                pair.after_seen = True
                # The trigger may be in the same chunk, after the ``after`` pattern.
                found = trigger.after.search(window)
                assert found is not None
                start = max(start, found.end())
            if not any(m.end() > start for m in trigger.pattern.finditer(window)):
                return None
            trigger.remaining -= 1
            trigger.fired += 1
            if trigger.remaining <= 0:
                trigger.done.set()
            if trigger.mode == "delay":
                pair.delay_reply = trigger.hold
                return None  # forwarded as any request
            pair.hold = trigger.hold
            if trigger.mode == "reply":
                pair.cut_on_reply = True
            return trigger.mode

    def _close(self, pair: _Pair) -> None:
        with self._lock:
            if pair.closed:
                return
            pair.closed = True
        for sock in (pair.client, pair.server):
            _reset(sock)


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped network path shows to both ends."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)  # wakes the thread reading it; sends nothing
    with contextlib.suppress(OSError):
        sock.close()
