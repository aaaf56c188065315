"""A node SIGKILLed: the other two keep quorum and take writes; restarted, it rejoins by IST
and has every write it missed. The test leaves the cluster whole again for the next one."""

from __future__ import annotations

import re
import time
from contextlib import closing
from pathlib import Path

import pytest

from tests.galera.harness import Cluster
from tests.galera.test_cluster import connect

pytestmark = pytest.mark.galera

WRITES = 200


def test_a_killed_node_leaves_a_working_cluster_and_rejoins_by_ist(
    galera: Cluster, galera_database: str
) -> None:
    first, second, third = galera.nodes
    with closing(connect(first, galera_database)) as conn, conn.cursor() as cursor:
        cursor.execute("CREATE TABLE missed (id INT PRIMARY KEY, node VARCHAR(16))")
        cursor.execute("INSERT INTO missed VALUES (0, 'before')")
        conn.commit()
    # Killed once it has applied them: a node killed in the middle of applying a DDL marks its
    # state unsafe and is given a full state transfer on restart instead (seen here once).
    with closing(connect(second, galera_database)) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT node FROM missed")
        assert cursor.fetchall() == (("before",),)

    started = time.monotonic()
    galera.kill(second)
    galera.wait_synced([first, third], timeout=60)
    print(f"\n{second.name} SIGKILLed; evicted in {time.monotonic() - started:.1f} s")
    assert first.status()["wsrep_cluster_size"] == "2"

    started = time.monotonic()
    for index in range(1, WRITES + 1):
        node = first if index % 2 else third
        with closing(connect(node, galera_database)) as conn, conn.cursor() as cursor:
            cursor.execute("INSERT INTO missed VALUES (%s, %s)", (index, node.name))
            conn.commit()
    print(f"{WRITES} writes through two nodes in {time.monotonic() - started:.2f} s")

    log_before = second.error_log.read_text(errors="replace")
    started = time.monotonic()
    position = galera.restart(second)
    print(f"{second.name} rejoined and Synced in {time.monotonic() - started:.1f} s")
    rejoin_log = second.error_log.read_text(errors="replace")[len(log_before) :]
    # By IST: the writesets it missed, from a survivor's gcache, not a copy of the data folder.
    received = re.search(r"Receiving IST: (\d+) writesets", rejoin_log)
    assert position, (Path(galera.root) / f"{second.name}-recover.err").read_text()[-3000:]
    assert received, "\n".join(re.findall(r".*(?:IST|SST|[Pp]osition).*", rejoin_log))
    assert int(received[1]) >= WRITES
    assert "rsync IST completed on joiner" in rejoin_log

    with closing(connect(second, galera_database)) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT COUNT(*), MAX(id) FROM missed")
        assert cursor.fetchall() == ((WRITES + 1, WRITES),)
        cursor.execute("INSERT INTO missed VALUES (%s, %s)", (WRITES + 1, second.name))
        conn.commit()
    with closing(connect(first, galera_database)) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT node FROM missed WHERE id = %s", (WRITES + 1,))
        assert cursor.fetchall() == ((second.name,),)
