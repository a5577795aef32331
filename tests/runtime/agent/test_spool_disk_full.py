"""The spool on a real, full file system (a small tmpfs): writes fail as SpoolFullError and roll back,
numbers are not burned, acknowledgements wait in memory, and everything works again once space is freed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgekit_runtime.agent.spool import Spool, SpoolFullError
from tests.runtime.agent.small_fs import fill, mounted_tmpfs

TOPIC = "edgekit/v1/lab/dev-1/telemetry"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "fs", size_kib=512) as mount_point:
        yield mount_point


def test_a_full_disk_refuses_writes_without_burning_numbers_and_recovers(small_fs: Path) -> None:
    # No headroom, no reserve: the spool's plain behaviour on a full disk (with them: test_spool_small_disk.py).
    with Spool(small_fs / "spool.db", headroom_bytes=0, reserve_bytes=0) as spool:
        first_id, first_seq = spool.append_numbered(TOPIC, lambda seq: f"window {seq}".encode())
        assert first_seq == 1 and not spool.disk_full and spool.write_error is None
        filler = fill(small_fs)
        for _ in range(200):  # small commits fit in the pages of the bounded WAL, reused after each checkpoint
            spool.next_seq()

        with pytest.raises(SpoolFullError, match="cannot queue a numbered message .* the file system is full") as info:
            spool.append_numbered(TOPIC, lambda seq: f"window {seq}".encode() + b"x" * 20_000)
        assert "free space on the spool's file system" in str(info.value)
        with pytest.raises(SpoolFullError, match="cannot queue a message"):
            spool.append(TOPIC, b"y" * 20_000)
        assert spool.disk_full and "file system is full" in spool.write_error.message
        burned = spool.last_seq()  # numbers taken by next_seq() before the disk refused
        assert spool.backlog() == 1 and [e.payload for e in spool.peek(5)] == [b"window 1"]

        # A delivered message cannot be removed now: the removal waits, and the message is not handed out again.
        assert spool.ack_many([first_id]) in (0, 1)
        assert spool.peek(5) == []

        filler.unlink()
        entry_id, seq = spool.append_numbered(TOPIC, lambda seq: f"window {seq}".encode())
        assert seq == burned + 1 and entry_id > first_id
        assert not spool.disk_full and spool.write_error is None
        assert [e.payload for e in spool.peek(5)] == [f"window {seq}".encode()]  # the deferred ack was committed
        assert spool.backlog() == 1


def test_a_payload_builder_that_fails_uses_no_number(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db") as spool:
        def broken(seq: int) -> bytes:
            raise ValueError(f"cannot encode window {seq}")

        with pytest.raises(ValueError, match="cannot encode window 1"):
            spool.append_numbered(TOPIC, broken)
        assert spool.append_numbered(TOPIC, lambda seq: b"ok")[1] == 1 and spool.backlog() == 1
        assert spool.add_dropped(3) == 3 and spool.dropped_total() == 3
