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
a dtype that cannot be cast without changing kind) and raises a `BufferInputError` that names the field.
"""

import numpy as np

__all__ = ["BufferInputError", "Schema", "to_torch"]


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
        """Zeroed arrays of shape ``(*lead, *per_env_shape)``; `dtypes` overrides storage dtypes by name."""
        dtypes = dtypes or {}
        return {
            name: np.zeros((*lead, *shape), dtype=dtypes.get(name, dtype))
            for name, (shape, dtype) in self.fields.items()
        }

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
            if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
                raise BufferInputError(
                    f"field {name!r} has dtype {arr.dtype}, which cannot become the declared {dtype} "
                    "without changing kind (e.g. float actions into an integer field)"
                )
            out[name] = arr
        return out


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
