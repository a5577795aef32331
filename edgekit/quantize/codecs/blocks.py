"""Cutting a tensor into fixed-size blocks along one axis (zero-padded) and putting it back together."""

from __future__ import annotations

import numpy as np

from edgekit.errors import QuantizationError


def check_block_and_axis(shape: tuple[int, ...], block: int, axis: int, *, what: str, tensor_name: str) -> int:
    """Validate ``block`` (a positive integer) and ``axis`` (an axis of ``shape``); return the axis as non-negative."""
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise QuantizationError(
            f"{what}: block={block!r} for tensor '{tensor_name}' is not a positive whole number of elements",
            hint="use the format's block size (32 for MX formats, 16 for NVFP4)",
        )
    ndim = len(shape)
    if ndim == 0:
        raise QuantizationError(
            f"{what}: tensor '{tensor_name}' is a scalar; block formats need at least one axis to cut into blocks",
            hint="reshape it to shape (1,) first",
        )
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        raise QuantizationError(
            f"{what}: axis={axis!r} is not an axis of tensor '{tensor_name}' with shape {shape}",
            hint=f"pass an axis in {-ndim}..{ndim - 1} (-1, the last axis, is the usual choice)",
        )
    return int(axis) % ndim


def to_blocks(values: np.ndarray, block: int, axis: int) -> np.ndarray:
    """Move ``axis`` last, zero-pad it to a multiple of ``block`` and split it: shape ``(*rest, n_blocks, block)``."""
    moved = np.moveaxis(values, axis, -1)
    length = moved.shape[-1]
    n_blocks = -(-length // block)
    padding = n_blocks * block - length
    if padding:
        moved = np.concatenate([moved, np.zeros((*moved.shape[:-1], padding), dtype=moved.dtype)], axis=-1)
    return moved.reshape(*moved.shape[:-1], n_blocks, block)


def from_blocks(blocked: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """Inverse of :func:`to_blocks`: merge the blocks, strip the padding, move the axis back."""
    merged = blocked.reshape(*blocked.shape[:-2], blocked.shape[-2] * blocked.shape[-1])
    stripped = merged[..., : shape[axis]]
    return np.ascontiguousarray(np.moveaxis(stripped, -1, axis))


def check_encoded(codes: np.ndarray, scales: np.ndarray, shape: tuple[int, ...], block: int, axis: int, *,
                  code_bits: int, what: str) -> tuple[tuple[int, ...], int]:
    """Check that block codes and scales fit ``shape`` cut along ``axis``; return ``(shape, non-negative axis)``."""
    shape = tuple(int(d) for d in shape)
    axis = check_block_and_axis(shape, block, axis, what=what, tensor_name="codes")
    expected = (*shape[:axis], *shape[axis + 1 :], -(-shape[axis] // block), block)
    codes_fit = isinstance(codes, np.ndarray) and codes.dtype == np.uint8 and codes.shape == expected
    scales_fit = isinstance(scales, np.ndarray) and scales.dtype == np.uint8 and scales.shape == expected[:-1]
    if not (codes_fit and scales_fit):
        raise QuantizationError(
            f"{what}: codes {getattr(codes, 'dtype', type(codes))}{getattr(codes, 'shape', '')} and scales "
            f"{getattr(scales, 'dtype', type(scales))}{getattr(scales, 'shape', '')} do not fit shape {shape} cut along "
            f"axis {axis} into blocks of {block} (expected uint8{expected} and uint8{expected[:-1]})",
            hint="build it with the matching *_quantize function rather than by hand",
        )
    if code_bits < 8 and (codes >= (1 << code_bits)).any():
        raise QuantizationError(f"{what}: element codes above {(1 << code_bits) - 1} for a {code_bits}-bit format",
                                hint="codes are unpacked, one per byte; unpack_fp4 packed data first")
    return shape, axis
