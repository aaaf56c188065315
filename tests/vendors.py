"""What the tests ask of each database server in its own SQL."""

from __future__ import annotations

#: How a transaction sets its bound on lock waits (atomic mode's wait_timeout sets it for the
#: claim), how it reads it back, and two values to set.
LOCK_WAIT = {
    "postgresql": (
        "SELECT set_config('lock_timeout', %s, true)",
        "SHOW lock_timeout",
        ["0", "7s"],
    ),
    "mysql": (
        "SET SESSION innodb_lock_wait_timeout = CAST(%s AS UNSIGNED)",
        "SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS CHAR)",
        ["50", "7"],
    ),
}

#: This connection's id on the server, and how another connection ends it.
BACKEND_ID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
TERMINATE = {"postgresql": "SELECT pg_terminate_backend(%s)", "mysql": "KILL CONNECTION %s"}

#: Other connections to this database sitting in an open transaction.
IN_TRANSACTION = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%%'",
    "mysql": "SELECT count(*) FROM information_schema.innodb_trx AS trx "
    "JOIN information_schema.processlist AS process ON process.id = trx.trx_mysql_thread_id "
    "WHERE process.db = DATABASE() AND process.id <> CONNECTION_ID()",
}

#: Makes this connection's later transactions (each autocommitted statement's too) refuse writes,
#: and puts it back: a database in a read-only spell, as this connection sees it.
READ_ONLY = {
    "postgresql": (
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
    ),
    "mysql": ("SET SESSION TRANSACTION READ ONLY", "SET SESSION TRANSACTION READ WRITE"),
    "sqlite": ("PRAGMA query_only = ON", "PRAGMA query_only = OFF"),
}
