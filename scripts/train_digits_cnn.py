#!/usr/bin/env python
"""Train the digits demo CNN and save its state_dict (the shipped ``edgekit/demos/weights/digits_cnn.pt``).

    python scripts/train_digits_cnn.py [--out PATH] [--epochs N] [--seed S]

Training is deterministic (seeded, one thread) and takes a few seconds on a CPU. The script logs the
held-out top-1 accuracy and fails if it is below the demo's 0.97 floor.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from edgekit.demos.digits_cnn import DEFAULT_EPOCHS, SHIPPED_WEIGHTS, heldout_top1, train_digits_cnn

MIN_HELDOUT_TOP1 = 0.97
log = logging.getLogger("train_digits_cnn")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SHIPPED_WEIGHTS, help=f"where to write the state_dict (default: {SHIPPED_WEIGHTS})")
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS, help=f"training epochs (default: {DEFAULT_EPOCHS})")
    parser.add_argument("--seed", type=int, default=0, help="seed for initialisation and batch order (default: 0)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    started_s = time.perf_counter()
    model = train_digits_cnn(epochs=args.epochs, seed=args.seed)
    elapsed_s = time.perf_counter() - started_s
    top1 = heldout_top1(model)
    log.info("trained %d epochs (seed %d) in %.1f s; held-out top-1 %.4f (500 images)", args.epochs, args.seed, elapsed_s, top1)
    if top1 < MIN_HELDOUT_TOP1:
        log.error("held-out top-1 %.4f is below %.2f; not writing %s", top1, MIN_HELDOUT_TOP1, args.out)
        return 1

    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out)
    log.info("wrote %s (%.0f KiB)", args.out, args.out.stat().st_size / 1024)
    return 0


if __name__ == "__main__":
    sys.exit(main())
