"""Jetson Linux (L4T) release -> JetPack release, from NVIDIA's release notes.

Each row cites the page that pairs the two. NVIDIA publishes every JetPack release with the Jetson
Linux release inside it (``developer.nvidia.com/embedded/jetpack-archive`` lists them all); an L4T
release not in this table is reported with ``jetpack = None`` and a reason, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JetPackRelease:
    l4t: str  # "36.4.3": the R number and REVISION of /etc/nv_tegra_release
    jetpack: str
    source: str


JETPACK_RELEASES: tuple[JetPackRelease, ...] = (
    JetPackRelease("32.7.1", "4.6.1", "developer.nvidia.com/embedded/jetpack-sdk-461 (JetPack 4.6.1 = L4T 32.7.1)"),
    JetPackRelease("32.7.2", "4.6.2", "developer.nvidia.com/embedded/jetpack-sdk-462 (JetPack 4.6.2 = L4T 32.7.2)"),
    JetPackRelease("32.7.3", "4.6.3", "developer.nvidia.com/embedded/jetpack-sdk-463 (JetPack 4.6.3 = L4T 32.7.3)"),
    JetPackRelease("32.7.4", "4.6.4", "developer.nvidia.com/embedded/jetpack-sdk-464 (JetPack 4.6.4 = L4T 32.7.4)"),
    JetPackRelease("32.7.5", "4.6.5", "developer.nvidia.com/embedded/jetpack-sdk-465 (JetPack 4.6.5 = L4T 32.7.5)"),
    JetPackRelease("35.1.0", "5.0.2", "developer.nvidia.com/embedded/jetpack-sdk-502 (JetPack 5.0.2 = Jetson Linux 35.1)"),
    JetPackRelease("35.2.1", "5.1", "developer.nvidia.com/embedded/jetpack-sdk-51 (JetPack 5.1 = Jetson Linux 35.2.1)"),
    JetPackRelease("35.3.1", "5.1.1", "developer.nvidia.com/embedded/jetpack-sdk-511 (JetPack 5.1.1 = Jetson Linux 35.3.1)"),
    JetPackRelease("35.4.1", "5.1.2", "developer.nvidia.com/embedded/jetpack-sdk-512 (JetPack 5.1.2 = Jetson Linux 35.4.1)"),
    JetPackRelease("35.5.0", "5.1.3", "developer.nvidia.com/embedded/jetpack-sdk-513 (JetPack 5.1.3 = Jetson Linux 35.5.0)"),
    JetPackRelease("35.6.0", "5.1.4", "developer.nvidia.com/embedded/jetpack-sdk-514 (JetPack 5.1.4 = Jetson Linux 35.6.0)"),
    JetPackRelease("36.2.0", "6.0 DP", "developer.nvidia.com/embedded/jetpack-sdk-60dp (JetPack 6.0 DP = Jetson Linux 36.2)"),
    JetPackRelease("36.3.0", "6.0", "developer.nvidia.com/embedded/jetpack-sdk-60 (JetPack 6.0 = Jetson Linux 36.3)"),
    JetPackRelease("36.4.0", "6.1", "developer.nvidia.com/embedded/jetpack-sdk-61 (JetPack 6.1 = Jetson Linux 36.4)"),
    JetPackRelease("36.4.3", "6.2", "developer.nvidia.com/embedded/jetpack-sdk-62 (JetPack 6.2 = Jetson Linux 36.4.3)"),
    JetPackRelease("36.4.4", "6.2.1", "developer.nvidia.com/embedded/jetpack-sdk-621 (JetPack 6.2.1 = Jetson Linux 36.4.4)"),
    JetPackRelease("38.2.0", "7.0", "docs.nvidia.com/jetson/archives/r38.2 release notes (JetPack 7.0 = Jetson Linux 38.2)"),
)

_BY_L4T = {row.l4t: row for row in JETPACK_RELEASES}


def normalize_l4t(version: str) -> str:
    """``"36.4"`` -> ``"36.4.0"``; three dot-separated numbers, as the table keys them."""
    parts = version.strip().split(".")
    while len(parts) < 3:
        parts.append("0")
    return ".".join(parts[:3])


def jetpack_for_l4t(l4t: str) -> JetPackRelease | None:
    """The JetPack release that ships Jetson Linux ``l4t`` (``"36.4.3"``, ``"36.4"``), or ``None``."""
    return _BY_L4T.get(normalize_l4t(l4t))


__all__ = ["JETPACK_RELEASES", "JetPackRelease", "jetpack_for_l4t", "normalize_l4t"]
