"""Saving a replay buffer's contents to one file and loading them back, so `--resume` replays the same data.

A buffer that mixes in `Snapshot` describes its state as ``(arrays, meta)``: named numpy arrays (the stored
fields, priorities, episode lengths) and a small JSON-able dict (write position, size). The file is an
uncompressed ``.npz`` (numpy's own format, no pickle); a run writes it through a temporary name and renames it
(runtime's `write_whole`), so an interrupted save never leaves a half-written snapshot behind.

`load` refuses, with a `BufferInputError` naming the file, anything the buffer could not go on from: another
buffer class, other fields, shapes or dtypes, missing metadata, a size or write position outside this buffer's
ring, or contents the buffer's own ``_check_state`` rejects (episode lengths, priorities).
"""

import json
import zipfile

import numpy as np

from buffers.schema import BufferInputError

__all__ = ["Snapshot"]

META = "__meta__"


class Snapshot:
    """``save(path)`` and ``load(path)`` for a buffer defining ``_state()``, ``_set_state(arrays, meta)``,
    ``_ring()`` (its number of slots and their name); ``_check_state`` may refuse the contents."""

    def save(self, file):
        """Write everything stored to `file`, a path or an open binary file (an .npz; a run writes its replay.npz
        whole or not at all through runtime's `write_whole`)."""
        arrays, meta = self._state()
        meta = json.dumps({"kind": type(self).__name__, **meta}).encode()
        np.savez(file, **{META: np.frombuffer(meta, np.uint8)}, **arrays)

    def load(self, path):
        """Replace the contents by those saved in `path` by a buffer of the same class, sizes and fields."""
        like, like_meta = self._state()
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
        if not isinstance(meta, dict):
            raise BufferInputError(f"buffer snapshot {path} is unreadable: its metadata is not a JSON object")
        kind = type(self).__name__
        if meta.get("kind") != kind:
            raise BufferInputError(f"{path} holds a {meta.get('kind')} snapshot; this buffer is a {kind}")
        if set(arrays) != set(like):
            raise BufferInputError(f"{path} holds the fields {sorted(arrays)}; this buffer has {sorted(like)}")
        missing = [k for k in like_meta if k not in meta]
        if missing:
            raise BufferInputError(
                f"{path} lacks the metadata {missing} (it has {sorted(meta)}): the file was altered or not written "
                "by save() of this buffer; start a new buffer"
            )
        self._check_ring(path, meta)
        for name, a in like.items():
            if arrays[name].shape != a.shape or arrays[name].dtype != a.dtype:
                raise BufferInputError(
                    f"{path}: field {name!r} was saved as {arrays[name].dtype} {arrays[name].shape}, this buffer "
                    f"holds {a.dtype} {a.shape}: build the buffer with the same capacity, envs and fields"
                )
        self._check_state(path, arrays, meta)
        self._set_state(arrays, meta)

    def _check_state(self, path, arrays, meta):
        """Refuse saved contents the buffer could not go on from (shapes and dtypes are already checked)."""

    def _check_ring(self, path, meta):
        """The saved ``size`` and write position ``pos`` must fit this buffer's ring of ``_ring()`` slots."""
        slots, unit = self._ring()
        pos, size = meta["pos"], meta["size"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (pos, size)):
            raise BufferInputError(
                f"{path}: pos={pos!r} and size={size!r}, expected integers: the file was altered or not written "
                "by save(); start a new buffer"
            )
        if not 0 <= size <= slots:
            raise BufferInputError(
                f"{path} holds size={size} {unit}, but this buffer's capacity is {slots} {unit}: load it into a "
                "buffer built with the snapshot's capacity and envs"
            )
        if not 0 <= pos < slots or (size < slots and pos != size):  # the ring fills from slot 0, then wraps
            raise BufferInputError(
                f"{path}: write position pos={pos} with size={size} of {slots} {unit}, expected 0 <= pos < {slots} "
                "and pos == size until full: the file was altered or not written by save(); start a new buffer"
            )
