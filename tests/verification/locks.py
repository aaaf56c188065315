"""Who holds a SQLite file's locks, and when: ``python -m tests.verification.locks PATH OUT``
samples ``/proc/locks`` (Linux) every few milliseconds and writes a line to ``OUT`` each time
the holders change: the time, then each process holding a lock as ``pid:kinds``, the kinds
``S`` (shared: reading), ``R`` (reserved: writing), ``P`` (pending: waiting for the readers
to commit), ``E`` (exclusive: committing) and ``p`` (a reader taking its shared lock: for that
moment no writer can take the pending one). SQLite's unix locks are byte ranges of the
file: the pending byte at 1 GiB, the reserved byte after it, then 510 shared bytes."""

from __future__ import annotations

import os
import signal
import sys
import time

PENDING_BYTE = 0x40000000
RESERVED_BYTE = PENDING_BYTE + 1
SHARED_FIRST = PENDING_BYTE + 2


def holders(inode: int) -> dict[int, str]:
    found: dict[int, set[str]] = {}
    with open("/proc/locks") as table:
        for line in table:
            fields = line.split()
            if len(fields) < 8 or fields[1] == "->" or fields[1] != "POSIX":
                continue
            if int(fields[5].rsplit(":", 1)[1]) != inode:
                continue
            kind, pid = fields[3], int(fields[4])
            start = int(fields[6])
            end = PENDING_BYTE * 4 if fields[7] == "EOF" else int(fields[7])
            kinds = found.setdefault(pid, set())
            if start <= PENDING_BYTE <= end:
                kinds.add("P" if kind == "WRITE" else "p")
            if start <= RESERVED_BYTE <= end and kind == "WRITE":
                kinds.add("R")
            if start <= SHARED_FIRST <= end:
                kinds.add("E" if kind == "WRITE" else "S")
    return {pid: "".join(sorted(kinds)) for pid, kinds in found.items() if kinds}


def threads(pid: int) -> list[str]:
    """Each thread of ``pid`` as ``tid/state/wchan/name``: ``D`` with a wchan of the page
    cache or the journal is a wait for the disk (an fsync), ``S`` in a futex a wait for a lock
    (the GIL), ``R`` running or waiting for a core."""
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                name, rest = stat.read().rsplit(")", 1)
            with open(f"/proc/{pid}/task/{tid}/wchan") as wchan:
                waits = wchan.read().strip() or "-"
        except OSError:
            continue
        found.append(f"{tid}/{rest.split()[0]}/{waits}/{name.split('(', 1)[1][:15]}")
    return found


#: How often the machine's stall counters are written (seconds).
PRESSURE_EVERY = 0.5


def pressure() -> list[str]:
    """The kernel's stall totals (microseconds; ``/proc/pressure``): tasks waiting for the
    disk (some, full) and for a core (some)."""
    found = []
    for name, kinds in (("io", ("some", "full")), ("cpu", ("some",))):
        try:
            with open(f"/proc/pressure/{name}") as table:
                lines = table.read().splitlines()
        except OSError:
            continue
        for line in lines:
            kind, *fields = line.split()
            if kind in kinds:
                found.append(f"{name}-{kind}={fields[-1].split('=')[1]}")
    return found


#: A holder of a lock this long (seconds) has its threads' states written, every
#: :data:`DIAGNOSE_EVERY` while it holds on.
DIAGNOSE_AFTER = 0.3
DIAGNOSE_EVERY = 0.1


#: A lock held this long (seconds) by a process that is not stopped has its holders' Python
#: stacks written (``trace.py``'s signal, to the processes it traces: ``stacks-<pid>.txt``).
DUMP_AFTER = 1.0


def main(path: str, out: str, every: float = 0.002, traces: str = "") -> None:
    inode = os.stat(path).st_ino
    last: dict[int, str] | None = None
    holding: dict[int, float] = {}
    dumped: set[int] = set()
    #: When each holder was last seen stopped (a stop's hold is the nemesis's, not a finding).
    stopped: dict[int, float] = {}

    def since_stop(pid: int) -> float:
        return max(holding[pid], stopped.get(pid, 0.0))

    diagnosed = pressed = 0.0
    with open(out, "a", buffering=1) as record:
        while os.path.exists(path):
            now = holders(inode)
            t = time.time()
            if t - pressed >= PRESSURE_EVERY:
                pressed = t
                record.write(f"@ {t:.4f} {' '.join(pressure())}\n")
            if now != last:
                record.write(
                    f"{t:.4f} " + " ".join(f"{pid}:{kinds}" for pid, kinds in sorted(now.items()))
                    + "\n"
                )  # fmt: skip
                last = now
            holding = {pid: holding.get(pid, t) for pid in now}
            long = [pid for pid, since in holding.items() if t - since >= DIAGNOSE_AFTER]
            dumping = [pid for pid in long if t - since_stop(pid) >= DUMP_AFTER]
            if traces and dumping and not any(_stopped(pid) for pid in now):
                for pid in now:
                    if pid not in dumped and os.path.exists(f"{traces}/stacks-{pid}.txt"):
                        dumped.add(pid)
                        record.write(f"! {t:.4f} dumped {pid}\n")
                        os.kill(pid, signal.SIGRTMIN + 3)
            dumped &= set(now)
            if long and t - diagnosed >= DIAGNOSE_EVERY:
                diagnosed = t
                load = os.getloadavg()[0]
                for pid in long:
                    held, states = t - holding[pid], " ".join(threads(pid))
                    if "/T/" in states:
                        stopped[pid] = t
                    record.write(f"# {t:.4f} {pid} held {held:.2f}s {load:.1f} {states}\n")
            time.sleep(every)


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], traces=sys.argv[3] if len(sys.argv) > 3 else "")
