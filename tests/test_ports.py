"""The ports the test servers listen on (:mod:`tests.ports`): outside the kernel's ephemeral
range, because a client dialling a stopped server's port there can take it (issue 32)."""

from __future__ import annotations

import socket
import sys

import pytest

from tests import ports
from tests.faults import databases

linux = pytest.mark.skipif(sys.platform != "linux", reason="the ephemeral range is Linux's")


@linux
def test_a_client_dialling_a_closed_ephemeral_port_can_take_it() -> None:
    """The cause: connects to a loopback port of the ephemeral range where nothing listens are
    refused until one gets that very port as its own and connects to itself. Linux hands
    connects the even ports first: an even one is dialled (the range's first port was)."""
    kernel = ports.ephemeral()
    middle = kernel.start + len(kernel) // 2
    target = ports.free(1, range(middle - middle % 2, kernel.stop, 2))[0]
    for _attempt in range(4 * len(kernel)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
            try:
                client.connect(("127.0.0.1", target))
            except ConnectionRefusedError:
                continue
            assert client.getsockname() == client.getpeername() == ("127.0.0.1", target)
            return
    pytest.fail(f"no connect to {target} met itself in {4 * len(kernel)} tries")


def test_the_fault_suite_refuses_a_range_of_ephemeral_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel = ports.ephemeral()
    inside = f"{kernel.start + 100}-{kernel.start + 199}"
    monkeypatch.setenv(databases.PORTS_VARIABLE, inside)
    with pytest.raises(databases.FaultHarnessError, match="ephemeral"):
        databases.port_range()
    monkeypatch.setenv(databases.PORTS_VARIABLE, f"{kernel.start - 50}-{kernel.start + 50}")
    with pytest.raises(databases.FaultHarnessError, match="ephemeral"):
        databases.port_range()
    below = f"{kernel.start - 100}-{kernel.start - 1}"
    monkeypatch.setenv(databases.PORTS_VARIABLE, below)
    assert databases.port_range() == range(kernel.start - 100, kernel.start)


def test_free_ports_skip_what_is_bound_and_what_was_handed_out() -> None:
    within = ports.below_ephemeral()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        first = ports.free(1, within)[0]
        listener.bind(("127.0.0.1", first))
        listener.listen()
        taken: set[int] = set()
        chosen = ports.free(3, range(first, within.stop), taken)
    assert first not in chosen
    assert len(set(chosen)) == 3
    assert taken == set(chosen)
    again = ports.free(3, range(first, within.stop), taken)
    assert set(again).isdisjoint(chosen)


def test_free_ports_say_when_the_range_is_used_up() -> None:
    within = ports.below_ephemeral()
    start = ports.free(1, within)[0]
    with pytest.raises(OSError, match="2 free ports wanted"):
        ports.free(2, range(start, start + 1))


def test_ports_below_the_ephemeral_range_are_outside_it() -> None:
    chosen = ports.free(12, ports.below_ephemeral())
    assert len(set(chosen)) == 12
    assert not any(port in ports.ephemeral() for port in chosen)
