"""Writing a training output file without ever leaving a half-written one."""

from __future__ import annotations

import os


def write_atomic(path: str, parts) -> int:
    """Write the byte strings `parts` to path through path.tmp, fsynced, then renamed over path (so a
    crash or a full disk keeps the old file); returns the bytes written."""
    tmp = f"{path}.tmp"
    size = 0
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
                size += len(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return size
