"""Writes a TensorBoard event file of STEPS steps x SCALARS scalars for bench/backfill_speed.sh.

Usage: make_event_file.py PATH STEPS SCALARS

The records are TensorBoard's Event protos in TFRecord framing, what tensorboardX writes, written directly
(tensorboardX's writer is ~20x slower). Scalar k of step s is s * 0.5 + k, stamped 0.1 s per step apart.
"""

import struct
import sys
import types

from jobkit.observe.tb_events import masked_crc32c


def record(event):
    """EVENT in TFRecord framing: length, its masked CRC, the bytes, their masked CRC."""
    data = event.SerializeToString()
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked_crc32c(head)) + data + struct.pack("<I", masked_crc32c(data))


def main(path, steps, scalars):
    # TensorBoard's protos import without TensorFlow once its compat stub is there.
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    t0 = 1700000000.0

    def scalar(step: int, k: int) -> bytes:
        value = Summary.Value(tag=f"bench/scalar_{k}", simple_value=step * 0.5 + k)
        return record(Event(wall_time=t0 + step * 0.1 + k * 0.001, step=step, summary=Summary(value=[value])))

    with open(path, "wb") as f:
        f.write(record(Event(wall_time=t0, file_version="brain.Event:2")))
        f.writelines(scalar(step, k) for step in range(steps) for k in range(scalars))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
