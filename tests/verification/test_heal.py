"""The nemesis's blackhole heals as a real partition does: the silenced connections are reset
(:meth:`FaultProxy.heal`). Left silent, an hour's PostgreSQL soak had two requests wait 30 s
after a 1 s blackhole, in a query of Django's own, and their keys never settled."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from tests import ports
from tests.faults.proxy import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with contextlib.suppress(ConnectionResetError):  # the heal resets the server's side too
            while data := self.request.recv(1024):
                self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxied = FaultProxy(ports.free(1, ports.below_ephemeral())[0], server.server_address[1])
    proxied.start()
    try:
        yield proxied
    finally:
        proxied.stop()
        server.shutdown()
        server.server_close()


def _echoed(client: socket.socket) -> bytes:
    client.sendall(b"ping")
    return client.recv(1024)


def test_a_healed_blackhole_resets_the_connections_it_silenced(proxy: FaultProxy) -> None:
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    assert _echoed(client) == b"ping"
    assert proxy.blackhole() == 1
    client.settimeout(0.3)
    with pytest.raises(TimeoutError):  # silent: no answer, no reset
        _echoed(client)
    assert proxy.heal() == 1
    client.settimeout(2)
    with pytest.raises(ConnectionResetError):
        _echoed(client)
    again = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    assert _echoed(again) == b"ping"


def test_restore_leaves_them_silent(proxy: FaultProxy) -> None:
    """The fault suite's own blackholes keep their meaning: a connection stays silent."""
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    assert _echoed(client) == b"ping"
    proxy.blackhole()
    proxy.restore()
    client.settimeout(0.3)
    with pytest.raises(TimeoutError):
        _echoed(client)
