#!/usr/bin/env python3
"""Split a large wheel into parts that fit a size-limited transfer, and put it back together, checked.

onnxruntime-gpu's wheel (255.6 MB for 1.31.1, CPython 3.12) is larger than one call to a lent GPU machine
carries (64 MiB with the working tree), so it travels as parts over consecutive calls and is reassembled
there (scripts/check_ort_gpu.sh):

    python scripts/wheel_parts.py split WHEEL DIR --part-mb 54 [--expect-sha256 HEX]  # DIR/part-01/.. + DIR/parts.json
    python scripts/wheel_parts.py join PARTS.json FOLDER... --out DIR  # checks every part and the whole

``parts.json`` records the wheel's name, size and sha256 and each part's; ``join`` looks for each part in
the folders given, refuses a missing, short or altered part by name, writes the wheel under its own file
name in ``--out`` and checks the sha256 of the result. It exits 1 with the reason on any mismatch.
``--expect-sha256`` (the hash PyPI publishes for the file) makes ``split`` refuse a wheel that differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def split(wheel: Path, out: Path, part_bytes: int) -> dict:
    """Write ``out/part-NN/<wheel>.partNN`` files of at most ``part_bytes`` and ``out/parts.json``; each
    part sits in its own folder so that one folder can travel per call."""
    if part_bytes <= 0:
        raise ValueError("the part size must be positive")
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    with wheel.open("rb") as source:
        index = 1
        while True:
            data = source.read(part_bytes)
            if not data:
                break
            folder = out / f"part-{index:02d}"
            folder.mkdir(exist_ok=True)
            part = folder / f"{wheel.name}.part{index:02d}"
            part.write_bytes(data)
            parts.append({"file": part.name, "folder": folder.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            index += 1
    record = {"wheel": wheel.name, "bytes": wheel.stat().st_size, "sha256": sha256_of(wheel), "parts": parts}
    (out / "parts.json").write_text(json.dumps(record, indent=1) + "\n")
    for part in parts:  # every folder carries the record too, so any call can check what it brought
        (out / part["folder"] / "parts.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def find_part(name: str, folders: list[Path]) -> Path | None:
    for folder in folders:
        for candidate in (folder / name, *folder.glob(f"*/{name}")):
            if candidate.is_file():
                return candidate
    return None


def join(record_path: Path, folders: list[Path], out: Path) -> Path:
    """The wheel rebuilt from its parts in ``folders``, every part and the whole checked against the record."""
    record = json.loads(record_path.read_text())
    problems = []
    found = []
    for part in record["parts"]:
        path = find_part(part["file"], folders)
        if path is None:
            problems.append(f"{part['file']}: not found in {', '.join(map(str, folders))}")
        elif path.stat().st_size != part["bytes"]:
            problems.append(f"{part['file']}: {path.stat().st_size} bytes, expected {part['bytes']} (cut short in transfer?)")
        elif sha256_of(path) != part["sha256"]:
            problems.append(f"{part['file']}: sha256 differs from parts.json (altered in transfer)")
        found.append(path)
    if problems:
        raise SystemExit("wheel_parts: cannot rebuild " + record["wheel"] + ":\n  " + "\n  ".join(problems))
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / record["wheel"]
    with wheel.open("wb") as target:
        for path in found:
            with path.open("rb") as source:
                for block in iter(lambda: source.read(CHUNK), b""):
                    target.write(block)
    actual = sha256_of(wheel)
    if actual != record["sha256"]:
        wheel.unlink()
        raise SystemExit(f"wheel_parts: {record['wheel']} rebuilt with sha256 {actual}, expected {record['sha256']}; removed")
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wheel_parts.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cut = commands.add_parser("split", help="cut WHEEL into parts under DIR")
    cut.add_argument("wheel", type=Path)
    cut.add_argument("dir", type=Path)
    cut.add_argument("--part-mb", type=float, default=54.0, help="part size in MB (10^6 bytes; default %(default)s)")
    cut.add_argument("--expect-sha256", metavar="HEX", help="refuse the wheel unless its sha256 is this (PyPI's published hash)")
    glue = commands.add_parser("join", help="rebuild the wheel from its parts and check it")
    glue.add_argument("record", type=Path, help="parts.json")
    glue.add_argument("folders", type=Path, nargs="+", help="folders holding the parts (searched one level down too)")
    glue.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "split":
        if args.expect_sha256 and sha256_of(args.wheel) != args.expect_sha256.lower():
            raise SystemExit(f"wheel_parts: {args.wheel} has sha256 {sha256_of(args.wheel)}, not the expected {args.expect_sha256}")
        record = split(args.wheel, args.dir, int(args.part_mb * 1_000_000))
        for part in record["parts"]:
            print(f"{part['folder']}/{part['file']}  {part['bytes'] / 1e6:.1f} MB  {part['sha256'][:16]}")
        print(f"{record['wheel']}: {record['bytes'] / 1e6:.1f} MB in {len(record['parts'])} parts, sha256 {record['sha256']}")
    else:
        wheel = join(args.record, args.folders, args.out)
        print(f"rebuilt {wheel} ({wheel.stat().st_size / 1e6:.1f} MB), sha256 matches parts.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
