"""Creating and dropping a benchmark's own database, on PostgreSQL or MySQL/MariaDB."""

from __future__ import annotations

from urllib.parse import urlsplit


def is_mysql(url: str) -> bool:
    return urlsplit(url).scheme.startswith("mysql")


def admin_execute(url: str, sql: str) -> None:
    """One statement in autocommit, on the server of ``url``."""
    if is_mysql(url):
        import MySQLdb

        parts = urlsplit(url)
        connection = MySQLdb.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=parts.username or "root",
            password=parts.password or "",
        )
        try:
            connection.cursor().execute(sql)
        finally:
            connection.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(sql)


def create_database(url: str, name: str) -> None:
    drop_database(url, name)
    if is_mysql(url):
        admin_execute(url, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    else:
        admin_execute(url, f'CREATE DATABASE "{name}"')


def drop_database(url: str, name: str) -> None:
    if is_mysql(url):
        admin_execute(url, f"DROP DATABASE IF EXISTS `{name}`")
    else:
        admin_execute(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
