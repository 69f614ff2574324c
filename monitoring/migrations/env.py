"""Alembic environment for the monitoring history store.

Run programmatically (:meth:`monitoring.db.Database.upgrade`, ``specdec db upgrade``): the caller
passes an open connection in ``config.attributes["connection"]``; otherwise the URL in
``sqlalchemy.url`` is used. Offline mode (``--sql``) renders the DDL for a DBA to apply.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from monitoring.db import Base

config = context.config
target_metadata = Base.metadata


def _configure(**kw) -> None:
    context.configure(target_metadata=target_metadata, compare_type=True, **kw)


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of touching a database."""
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True,
               dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run(connection) -> None:
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate through the caller's connection, or open one from ``sqlalchemy.url``."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
