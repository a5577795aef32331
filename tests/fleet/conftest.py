"""Fixtures for the collector and store tests: fleet stores on SQLite and on a real PostgreSQL, and a
real Mosquitto per test module.

PostgreSQL: ``EDGEKIT_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``) names
a database to connect to; the session creates its own database next to it and drops it at the end,
and every test gets a fresh schema in it. Without a reachable server the PostgreSQL cases skip.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from edgekit.fleet.store import FleetStore, open_store
from tests.runtime.agent.mosquitto import MosquittoBroker

POSTGRES_URL = os.environ.get("EDGEKIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """URL of a database created for this test session (dropped afterwards)."""
    psycopg = pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install 'edgekit[fleet]')")
    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_URL}: {str(exc).strip()}")
    name = f"edgekit_fleet_test_{os.getpid()}_{secrets.token_hex(3)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(POSTGRES_URL)
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def postgres_url(postgres_database: str) -> str:
    """A store URL on a fresh schema of the session's database."""
    import psycopg

    schema = f"t_{secrets.token_hex(4)}"
    with psycopg.connect(postgres_database, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    return f"{postgres_database}?options=-csearch_path%3D{schema}"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fleet.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def store(store_url: str) -> Iterator[FleetStore]:
    with open_store(store_url) as opened:
        yield opened


@pytest.fixture(scope="module")
def fleet_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MosquittoBroker]:
    """One Mosquitto for the whole test module (queues without bound, so bursts are never dropped)."""
    with MosquittoBroker(tmp_path_factory.mktemp("mosquitto"), extra_config=["max_queued_messages 0"]) as broker:
        yield broker
