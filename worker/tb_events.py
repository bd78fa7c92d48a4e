"""TensorBoard event files written without TensorFlow: the agent's resource scalars.

An event file is a TFRecord stream (length, masked CRC-32C of the length, the record, its masked
CRC-32C) of serialized `tensorflow.Event` protocol buffers; a scalar is an Event with a
Summary holding one Value (tag, simple_value). The few fields needed are encoded here by hand,
so the agent stays on the standard library.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path

_CRC32C_POLY = 0x82F63B78
_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ _CRC32C_POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint; a negative int64 as its two's complement (ten bytes), as
    protobuf writes it (a negative value shifted right never reaches 0)."""
    value &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    """Event{wall_time = 1 (double), step = 2 (int64)} followed by `body`."""
    return _key(1, 1) + struct.pack("<d", wall_time) + _key(2, 0) + _varint(step) + body


def scalars_event(wall_time: float, step: int, values: Mapping[str, float]) -> bytes:
    """One Event whose Summary (field 5) holds a Value{tag = 1, simple_value = 2} per scalar."""
    summary = b"".join(
        _length_delimited(1, _length_delimited(1, tag.encode()) + _key(2, 5)
                          + struct.pack("<f", value))
        for tag, value in values.items()
    )  # fmt: skip
    return _event(wall_time, step, _length_delimited(5, summary))


def record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked(length)) + data + struct.pack("<I", _masked(data))


class EventWriter:
    """Appends scalars to a new event file in `run_dir` (made on first write)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path: Path | None = None

    def scalars(
        self, step: int, values: Mapping[str, float], wall_time: float | None = None
    ) -> None:
        wall_time = time.time() if wall_time is None else wall_time
        data = record(scalars_event(wall_time, step, values))
        if self.path is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            name = f"events.out.tfevents.{int(wall_time)}.{socket.gethostname()}.{os.getpid()}.0"
            self.path = self.run_dir / name
            data = record(_event(wall_time, 0, _length_delimited(3, b"brain.Event:2"))) + data
        with open(self.path, "ab") as f:
            f.write(data)
