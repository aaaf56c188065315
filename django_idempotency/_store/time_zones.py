"""Whether a database can convert dates to the current time zone, as Django's date functions
(the admin's date hierarchy) ask it to.

MySQL and MariaDB convert to a named zone (``Europe/Berlin``) with ``CONVERT_TZ``, which needs
the server's time-zone tables; without them (the default of most installs and container images)
it answers ``NULL`` and Django raises "Database returned an invalid datetime value". The admin
then leaves its date hierarchy out rather than answer 500, and the system check W002 says so.
PostgreSQL and SQLite convert on their own
(:meth:`.bound.BoundStore.converts_dates_to`).
"""

from __future__ import annotations

from functools import cache

from django.db import connections

#: A moment that exists in every zone, as the database stores a datetime.
_PROBE = "2000-06-15 12:00:00"

#: How to load the tables, for the check's hint and the docs.
LOAD_TABLES = (
    "Load the server's time-zone tables (mariadb-tzinfo-to-sql /usr/share/zoneinfo | "
    "mariadb -u root mysql; mysql_tzinfo_to_sql on MySQL) and restart the app, or set "
    "TIME_ZONE = 'UTC'."
)


@cache
def converts(alias: str, stored_in: str, zone: str) -> bool:
    """Whether ``alias``'s MySQL or MariaDB database, its datetimes stored in the zone
    ``stored_in``, can convert them to the zone ``zone``
    (:meth:`.mysql.MySQLStore.converts_dates_to`). Once per process and pair of zones: the
    tables are there or not."""
    connection = connections[alias]
    # The SQL Django's own date truncation sends (datetimes(), the date hierarchy), on a value.
    # django-stubs still types it as before Django 4.2, which returned the SQL alone.
    sql, params = connection.ops.datetime_trunc_sql(  # type: ignore[str-unpack]
        "year", "%s", (_PROBE,), zone
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {sql}", params)
        row = cursor.fetchone()
    return row is not None and row[0] is not None
