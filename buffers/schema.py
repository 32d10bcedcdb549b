"""Field schemas: the one place where a script's declared fields become preallocated arrays.

A script declares its fields once, ``{name: (per_env_shape, dtype)}``, for example::

    fields = {
        "obs": ((3, 18), np.float32),      # (A, obs_dim) per env
        "state": ((54,), np.float32),
        "actions": ((3,), np.int64),
        "rewards": ((3,), np.float32),
        "terminated": ((3,), np.bool_),
        "truncated": ((), np.bool_),
    }

Every buffer validates what it is given against the schema (a missing or unknown field, a wrong shape,
a lossy dtype) and raises a `BufferInputError` that names the field. What a field accepts:

* its own dtype, always, at no cost;
* integers into an integer field (signed or unsigned) when every value fits the field's dtype; the
  min and max are checked only when the given dtype could hold values the field's cannot (int64 300
  into an int8 field is refused instead of wrapping to 44);
* bools into any field (0/1), integers into a float field, a wider float into a narrower one (rounded);
* never floats into an integer or bool field, nor integers into a bool field: cast explicitly
  (``actions.astype(np.int64)``, ``terminated != 0``) so rounding and truncation are the script's choice.
"""

import math
import os

import numpy as np

__all__ = ["BufferInputError", "Schema", "to_torch"]


def physical_memory():
    """Bytes of physical memory, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class BufferInputError(ValueError):
    """A buffer was used in a way its schema or its state does not allow; the message says how to fix it."""


class Schema:
    """Normalised field declarations: name -> (per-env shape tuple, numpy dtype)."""

    def __init__(self, fields):
        if not fields:
            raise BufferInputError("a buffer needs at least one field: {name: (per_env_shape, dtype)}")
        self.fields = {}
        for name, spec in fields.items():
            try:
                shape, dtype = spec
                shape = (shape,) if np.isscalar(shape) else tuple(int(s) for s in shape)
                dtype = np.dtype(dtype)
            except (TypeError, ValueError) as e:
                raise BufferInputError(
                    f"field {name!r} is declared as {spec!r}; expected (per_env_shape, dtype), "
                    "e.g. ((3, 18), np.float32)"
                ) from e
            self.fields[name] = (shape, dtype)

    def __contains__(self, name):
        return name in self.fields

    def __iter__(self):
        return iter(self.fields)

    def shape(self, name):
        return self.fields[name][0]

    def allocate(self, lead, dtypes=None):
        """Zeroed arrays of shape ``(*lead, *per_env_shape)``; `dtypes` overrides storage dtypes by name. A buffer
        larger than the machine's memory is refused in one line (not an out-of-memory kill halfway through a run)."""
        dtypes = dtypes or {}
        need = sum(math.prod((*lead, *shape)) * np.dtype(dtypes.get(name, dtype)).itemsize
                   for name, (shape, dtype) in self.fields.items())  # fmt: skip
        ram = physical_memory()
        each = need / max(math.prod(lead), 1)
        message = (f"this buffer needs {need / 2**30:.1f} GiB for {math.prod(lead):,} steps of "
                   + (f"{each / 2**10:,.0f} KiB" if each >= 2**10 else f"{each:.0f} bytes") + " each")  # fmt: skip
        if ram is not None and need > ram:
            raise BufferInputError(f"{message}, more than this machine's {ram / 2**30:.1f} GiB: lower its capacity "
                                   f"(--buffer-size)")  # fmt: skip
        try:
            return {
                name: np.zeros((*lead, *shape), dtype=dtypes.get(name, dtype))
                for name, (shape, dtype) in self.fields.items()
            }
        except MemoryError:
            raise BufferInputError(
                f"{message}, which could not be allocated: lower its capacity (--buffer-size)"
            ) from None

    def check(self, step, lead, partial=False):
        """Validate one `add` call: every declared field (unless `partial`), each of shape (*lead, *shape)."""
        unknown = [k for k in step if k not in self.fields]
        if unknown:
            raise BufferInputError(f"unknown field(s) {unknown}; this buffer declares {list(self.fields)}")
        if not partial:
            missing = [k for k in self.fields if k not in step]
            if missing:
                raise BufferInputError(f"missing field(s) {missing}: every declared field must be given to add()")
        out = {}
        for name, value in step.items():
            shape, dtype = self.fields[name]
            arr = np.asarray(value)
            if arr.shape != (*lead, *shape):
                raise BufferInputError(
                    f"field {name!r} has shape {arr.shape}, expected {(*lead, *shape)} "
                    f"(leading {lead} then the declared per-env shape {shape})"
                )
            if arr.dtype != dtype:
                _check_cast(name, arr, dtype)
            out[name] = arr
        return out


def _check_cast(name, arr, dtype):
    """Refuse a lossy cast of `arr` into field `name` of `dtype`: another kind, or integers out of range."""
    if arr.dtype.kind in "iu" and dtype.kind in "iu":  # one kind here: what matters is the values' range
        if np.can_cast(arr.dtype, dtype) or arr.size == 0:
            return
        lo, hi, info = int(arr.min()), int(arr.max()), np.iinfo(dtype)
        if lo < info.min or hi > info.max:
            raise BufferInputError(
                f"field {name!r} holds {lo if lo < info.min else hi} ({arr.dtype}), outside the range "
                f"[{info.min}, {info.max}] of its declared {dtype}: declare a wider dtype or keep the values in range"
            )
    elif not np.can_cast(arr.dtype, dtype, casting="same_kind"):
        fix = "pass booleans (e.g. `x != 0`)" if dtype.kind == "b" else f"cast explicitly (`.astype(np.{dtype})`)"
        raise BufferInputError(
            f"field {name!r} has dtype {arr.dtype}, which cannot become the declared {dtype} without changing "
            f"kind (e.g. float actions into an integer field): {fix} or declare the field as {arr.dtype}"
        )


def float_tensor(x, device="cpu"):
    """One array from the env (observations, a state, action masks) as a float32 tensor on `device`: the acting path's
    conversion, as `to_torch` is a sampled batch's."""
    import torch

    return torch.as_tensor(np.asarray(x), dtype=torch.float32, device=device)


def to_torch(batch, device="cpu"):
    """Convert a sampled batch (dict of numpy arrays) to torch tensors on `device`, in one place.

    Floats become float32, bools become float32 0/1 (masks multiply losses), integers become int64.
    """
    import torch

    out = {}
    for name, arr in batch.items():
        if arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.floating):
            arr = arr.astype(np.float32, copy=False)
        elif np.issubdtype(arr.dtype, np.integer):
            arr = arr.astype(np.int64, copy=False)
        out[name] = torch.as_tensor(np.ascontiguousarray(arr), device=device)
    return out
