"""Settings of the servers the app-level cluster tests start: ``tests/servers`` over Django's
``mysql`` backend (``DATABASE_URL`` names the server's own node), with causal reads, as
``docs/scale.rst`` recommends for Galera: a statement first waits until its node has applied
every write the cluster committed before it, so a retry through another node sees the claim."""

from __future__ import annotations

from tests.servers.settings import *  # noqa: F403
from tests.servers.settings import DATABASES

for _alias in ("default", "idempotency", "unreachable"):
    DATABASES[_alias]["OPTIONS"] = {
        **DATABASES[_alias].get("OPTIONS", {}),
        "init_command": "SET SESSION wsrep_sync_wait = 7",
    }
