"""Parse a JSON inference request without one Python object per tensor value.

``json.loads`` on a 60 MB request holds the text (a ``str`` copy of the body) and a float object plus a
list slot per value (about 33 bytes each): 2.5x the body at its peak, whatever the model. Here every
array of numbers of at least :data:`MIN_NUMERIC_ARRAY_BYTES` is cut out of the body and parsed straight
into a numpy array, a megabyte of text at a time; the rest (keys, names, dtypes, shapes: a few hundred
bytes) goes through ``json.loads`` with a placeholder string where each array was, which is then swapped
for the array. So a request costs its bytes plus its values as float64 or int64.

What the arrays must be: nested lists of numbers (``-1.5e3``; what numpy reads from text, a little more
than JSON allows, such as ``+1``; not ``NaN``, strings or booleans, which stay with ``json.loads`` and the
decoders' own checks), rectangular (every list at one depth has
as many items), at most :data:`MAX_RANK` deep. Their nesting gives the array's shape, as ``np.asarray``
would. Integers become int64 (exact), any number with a fraction or exponent float64. Every failure is
an :class:`~edgekit_runtime.errors.InputSignatureError` naming the byte offset.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np

from edgekit_runtime.errors import InputSignatureError

#: arrays shorter than this stay with json.loads (shapes, small tensors: nothing to save)
MIN_NUMERIC_ARRAY_BYTES = 4096
#: deepest nesting of one tensor's data (numpy's own limit is 64)
MAX_RANK = 32
#: how much text is parsed at a time
_CHUNK_BYTES = 1 << 20
_PLACEHOLDER = "\x00edgekit-array-{}"
#: one token of the text around the arrays, matched where the last one ended: a string, a '[', anything else
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|\[|[^"\[]+')
#: what a nested array of numbers is made of
_NUMERIC_RUN = re.compile(rb"[-0-9eE+.,\[\]\s]*")
_FRACTION = re.compile(rb"[.eE]")
_HINT = 'send {"inputs": ...} with each tensor\'s data as nested lists of numbers'


def loads_tensor_json(body: bytearray) -> Any:
    """The JSON value of ``body`` (UTF-8), its large arrays of numbers as numpy arrays."""
    spans = _numeric_spans(body)
    if not spans:
        return json.loads(body.decode("utf-8"))
    pieces: list[bytes] = []
    start = 0
    placeholder = _PLACEHOLDER.replace("{}", secrets.token_hex(8) + "-{}")  # this request's own: no string it sends matches
    for index, (begin, end) in enumerate(spans):
        pieces += [bytes(body[start:begin]), json.dumps(placeholder.format(index)).encode("ascii")]
        start = end
    pieces.append(bytes(body[start:]))
    skeleton = json.loads(b"".join(pieces).decode("utf-8"))
    arrays = {placeholder.format(index): _parse_array(body, begin, end) for index, (begin, end) in enumerate(spans)}
    return _swap(skeleton, arrays)


def _swap(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, str):
        return arrays.get(value, value)
    if isinstance(value, dict):
        return {key: _swap(item, arrays) for key, item in value.items()}
    if isinstance(value, list):
        return [_swap(item, arrays) for item in value]
    return value


def _numeric_spans(body: bytearray) -> list[tuple[int, int]]:
    """(start, end) of every array of numbers at least MIN_NUMERIC_ARRAY_BYTES long, outside strings. One pass:
    each token is matched where the last ended, and a run of array characters is skipped whole when it is
    not one array of numbers (so no byte is looked at more than a few times, whatever the body)."""
    spans: list[tuple[int, int]] = []
    position, size = 0, len(body)
    while position < size:
        if body[position] != 0x5B:  # not '['
            token = _TOKEN.match(body, position)
            if token is None:
                raise InputSignatureError(f"request body is not valid JSON: the string at byte {position} does not end",
                                          hint=_HINT)  # fmt: skip
            position = token.end()
            continue
        run_end = _NUMERIC_RUN.match(body, position).end()  # type: ignore[union-attr]
        end = _closing_bracket(body, position, run_end) if run_end - position >= MIN_NUMERIC_ARRAY_BYTES else None
        if end is None:
            position = position + 1 if run_end - position < MIN_NUMERIC_ARRAY_BYTES else run_end  # json.loads reads it
            continue
        spans.append((position, end))
        position = end
    return spans


def _brackets(body: bytearray, start: int, end: int) -> Iterator[tuple[int, bool]]:
    """(position, opens) of every '[' and ']' in ``body[start:end]``, in order (memchr speed, no regex)."""
    next_open, next_close = body.find(b"[", start, end), body.find(b"]", start, end)
    while next_open >= 0 or next_close >= 0:
        if next_open >= 0 and (next_close < 0 or next_open < next_close):
            yield next_open, True
            next_open = body.find(b"[", next_open + 1, end)
        else:
            yield next_close, False
            next_close = body.find(b"]", next_close + 1, end)


def _closing_bracket(body: bytearray, begin: int, run_end: int) -> int | None:
    """The end (one past ``]``) of the array opened at ``begin``, if it closes within the numeric run and
    nests at most MAX_RANK deep."""
    depth = 0
    for position, opens in _brackets(body, begin, run_end):
        depth += 1 if opens else -1
        if depth == 0:
            return position + 1
        if depth > MAX_RANK:
            return None
    return None


class _PastInt64(InputSignatureError):
    """An integer past int64's range: the array is read again as uint64 when it has no negative number."""


def _parse_array(body: bytearray, begin: int, end: int) -> np.ndarray:
    is_float = _FRACTION.search(body, begin, end) is not None
    try:
        return _parse_array_as(body, begin, end, np.float64 if is_float else np.int64)
    except _PastInt64:
        if body.find(b"-", begin, end) >= 0:
            raise
        return _parse_array_as(body, begin, end, np.uint64)  # UINT64 data up to 2**64 - 1, as json.loads reads it


def _parse_array_as(body: bytearray, begin: int, end: int, dtype: type) -> np.ndarray:
    shape, innermost = _shape(body, begin, end)
    count = int(np.prod(shape)) if shape else 0
    values = np.empty(count, dtype)
    filled = 0
    for first, last in innermost:  # the innermost lists, in order: their numbers are the values in C order
        chunk_start = first
        while chunk_start < last:
            chunk_end = min(last, chunk_start + _CHUNK_BYTES)
            if chunk_end < last:  # cut after a comma, never inside a number
                comma = body.rfind(b",", chunk_start, chunk_end)
                if comma < 0:
                    raise InputSignatureError(f"request body: a number of over {_CHUNK_BYTES} bytes at byte {chunk_start}", hint=_HINT)
                chunk_end = comma + 1
            text = bytes(memoryview(body)[chunk_start:chunk_end])
            filled = _parse_chunk(text[:-1] if chunk_end < last else text, chunk_start, values, filled)
            chunk_start = chunk_end
    if filled != count:  # unreachable when _shape counted right; never hand on uninitialised values
        raise InputSignatureError(f"request body: the array at byte {begin} holds {filled} numbers, its nesting says {count}", hint=_HINT)
    return values.reshape(shape)


def _parse_chunk(text: bytes, offset: int, values: np.ndarray, filled: int) -> int:
    if not text.strip():
        return filled
    tokens = text.split(b",")
    if filled + len(tokens) > len(values):
        raise InputSignatureError(f"request body: the array at byte {offset} holds more numbers than its nesting says", hint=_HINT)
    try:
        values[filled : filled + len(tokens)] = np.array(tokens).astype(values.dtype)
    except OverflowError as err:
        raise _PastInt64(f"request body: a number near byte {offset} does not fit {values.dtype.name} ({err})",
                         hint="integers must fit int64, or uint64 in an array without negative numbers") from err  # fmt: skip
    except ValueError as err:
        raise InputSignatureError(f"request body: the array of numbers near byte {offset} holds something that is not a "
                                  f"number ({err})", hint=_HINT) from err  # fmt: skip
    return filled + len(tokens)


def _shape(body: bytearray, begin: int, end: int) -> tuple[list[int], list[tuple[int, int]]]:
    """The nested shape of the array ``body[begin:end]`` and the (start, end) of its innermost lists' contents;
    refuses ragged nesting, numbers beside lists and missing or extra commas between lists."""
    children: list[list[int]] = []  # per open list: [child lists, start of content]
    dims: list[int | None] = []
    innermost: list[tuple[int, int]] = []
    rank: int | None = None
    previous_end, previous_open = begin, False
    for position, opens in _brackets(body, begin, end):
        if not (previous_open and not opens) and bytes(memoryview(body)[previous_end:position]).strip(b", \t\r\n"):
            raise _ragged(previous_end)  # a number beside lists
        previous_end, previous_open = position + 1, opens
        if opens:
            if children:
                children[-1][0] += 1
            children.append([0, position + 1])
            continue
        lists, content_start = children.pop()
        depth = len(children)  # 0 for the outermost list
        content_end = position
        if lists == 0:  # innermost: count its numbers
            rank = depth + 1 if rank is None else rank
            if depth + 1 != rank:
                raise _ragged(position)
            blank = content_end - content_start <= 64 and not bytes(body[content_start:content_end]).strip()
            items = 0 if blank else body.count(b",", content_start, content_end) + 1
            innermost.append((content_start, content_end))
        else:
            items = lists
        while len(dims) <= depth:
            dims.append(None)
        if dims[depth] is None:
            dims[depth] = items
        elif dims[depth] != items:
            raise _ragged(position)
    shape = [int(d) for d in dims if d is not None]
    commas, lists_at_depth = 0, 1
    for dim in shape:  # each list of a dim holds dim - 1 commas between its items
        commas += lists_at_depth * max(dim - 1, 0)
        lists_at_depth *= dim
    if body.count(b",", begin, end) != commas:
        raise _ragged(begin)
    return shape, innermost


def _ragged(offset: int) -> InputSignatureError:
    return InputSignatureError(f"request body: the nested data near byte {offset} is not rectangular (lists of one "
                               "depth differ in length, or numbers sit beside lists)",
                               hint="nest data once per dim, every list of a dim equally long")  # fmt: skip
