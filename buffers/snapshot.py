"""Saving a replay buffer's contents to one file and loading them back, so `--resume` replays the same data.

A buffer that mixes in `Snapshot` describes its state as ``(arrays, meta)``: named numpy arrays (the stored
fields, priorities, episode lengths) and a small JSON-able dict (write position, size). The file is an
uncompressed ``.npz`` (numpy's own format, no pickle), written to a temporary name and renamed, so an
interrupted save never leaves a half-written snapshot behind.
"""

import json
import os
import zipfile

import numpy as np

from buffers.schema import BufferInputError

__all__ = ["Snapshot"]

META = "__meta__"


class Snapshot:
    """``save(path)`` and ``load(path)`` for a buffer defining ``_state()`` and ``_set_state(arrays, meta)``."""

    def save(self, path):
        """Write everything stored to `path` (an .npz file; overwritten atomically)."""
        arrays, meta = self._state()
        meta = json.dumps({"kind": type(self).__name__, **meta}).encode()
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, **{META: np.frombuffer(meta, np.uint8)}, **arrays)
        os.replace(tmp, path)

    def load(self, path):
        """Replace the contents by those saved in `path` by a buffer of the same class, sizes and fields."""
        like, _ = self._state()
        try:
            with np.load(path, allow_pickle=False) as f:
                meta = json.loads(bytes(f[META]).decode())
                arrays = {name: f[name] for name in f.files if name != META}
        except FileNotFoundError:
            raise BufferInputError(f"no buffer snapshot at {path}") from None
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
            raise BufferInputError(
                f"buffer snapshot {path} is unreadable (corrupt or not written by save()): {e}"
            ) from None
        kind = type(self).__name__
        if meta.get("kind") != kind:
            raise BufferInputError(f"{path} holds a {meta.get('kind')} snapshot; this buffer is a {kind}")
        if set(arrays) != set(like):
            raise BufferInputError(f"{path} holds the fields {sorted(arrays)}; this buffer has {sorted(like)}")
        for name, a in like.items():
            if arrays[name].shape != a.shape or arrays[name].dtype != a.dtype:
                raise BufferInputError(
                    f"{path}: field {name!r} was saved as {arrays[name].dtype} {arrays[name].shape}, this buffer "
                    f"holds {a.dtype} {a.shape}: build the buffer with the same capacity, envs and fields"
                )
        self._set_state(arrays, meta)
