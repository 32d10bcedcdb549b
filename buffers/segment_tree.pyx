# cython: boundscheck=False, wraparound=False, nonecheck=False, cdivision=True, initializedcheck=False
"""Sum and min segment trees over float64 with batched calls: the core of prioritized replay.

Layout: an 8-ary tree stored level by level in one flat, 64-byte-aligned array. Level 0 holds the
leaves (capacity rounded up to a multiple of 8); entry j of level d + 1 is the sum (or min) of entries
8j .. 8j + 7 of level d, so the 8 children of a node fill exactly one cache line. A query or update at
capacity 2**20 touches 7 cache lines instead of the 20 of a binary tree, and a tree costs 8/7 of its
capacity in memory. Padding entries hold the neutral element (0 for sums, +inf for minima).

Every public method takes a whole batch, validates it once (an out-of-range index or a negative / NaN
priority raises a ValueError that names the position) and then runs one C loop without the GIL.
Batched calls walk the tree *level by level*: all queries descend (or all updates climb) one level
before any goes further, and each prefetches the line it needs next, so the cache misses of
independent queries overlap instead of queueing.

Speed at capacity 2**20 (results/speed/kernels.md, 2-core EPYC): stratified sampling of 256 indices
~30 us (a binary layout took ~45 us), 256 updates ~7.6 us (binary: ~14 us); cpprb's buffer ~2.6x slower.
"""

import numpy as np

from libc.math cimport INFINITY, nextafter


cdef extern from *:
    """
    #define PREFETCH_READ(p) __builtin_prefetch((p), 0, 3)
    #define PREFETCH_WRITE(p) __builtin_prefetch((p), 1, 3)
    """
    void PREFETCH_READ(const void *p) noexcept nogil
    void PREFETCH_WRITE(const void *p) noexcept nogil





cdef inline double _min(double a, double b) noexcept nogil:
    return a if a < b else b


cdef class _SegmentTree:
    """Shared storage, validation and range logic; `SumTree` and `MinTree` pick the operation."""

    cdef readonly Py_ssize_t capacity
    cdef Py_ssize_t depth  # levels above the leaves; level `depth` is the root (one entry)
    cdef Py_ssize_t offsets[32]  # start of each level in `tree` (8**32 leaves is plenty)
    cdef object _storage
    cdef double[::1] tree
    cdef double neutral
    cdef bint is_min
    cdef long long[::1] _nodes

    def __cinit__(self, Py_ssize_t capacity, *args, **kwargs):
        if capacity < 1:
            raise ValueError(f"segment tree capacity must be >= 1, got {capacity}")
        self.capacity = capacity

    def _init(self, double neutral, bint is_min):
        self.neutral = neutral
        self.is_min = is_min
        cdef Py_ssize_t n = (self.capacity + 7) // 8 * 8, total = 0, d = 0
        while True:  # level sizes: multiples of 8 (one cache line per parent) until the single root
            self.offsets[d] = total
            total += n
            if n == 1:
                break
            n = (n + 7) // 8
            if n > 1:
                n = (n + 7) // 8 * 8
            d += 1
        self.depth = d
        storage = np.full(total + 8, neutral, dtype=np.float64)
        start = (-storage.ctypes.data % 64) // 8  # align level 0 (and so every level) to 64 bytes
        self._storage = storage
        self.tree = storage[start : start + total]

    def __len__(self):
        return self.capacity

    def _indices(self, indices):
        """Indices as a contiguous int64 array, every one checked to lie in [0, capacity)."""
        if isinstance(indices, np.ndarray) and indices.ndim == 1 and indices.dtype == np.int64:
            idx_arr = np.ascontiguousarray(indices)  # the common case: no conversion, no reshape
        else:
            idx_arr = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        cdef long long[::1] idx = idx_arr
        cdef Py_ssize_t k, n = idx.shape[0], bad = -1
        cdef long long cap = self.capacity
        with nogil:
            for k in range(n):
                if idx[k] < 0 or idx[k] >= cap:
                    bad = k
                    break
        if bad >= 0:
            raise ValueError(
                f"index {idx_arr[bad]} (position {bad} of the batch) is outside the tree's range [0, {cap})"
            )
        return idx_arr

    cdef long long[::1] _scratch_nodes(self, Py_ssize_t n):
        """A reusable int64 work array of at least n entries (saves an allocation per call)."""
        if self._nodes is None or self._nodes.shape[0] < n:
            self._nodes = np.empty(max(n, 256), dtype=np.int64)
        return self._nodes

    def update(self, indices, values):
        """Set leaf `indices[k]` to `values[k]` for every k (a later duplicate wins), then repair parents."""
        cdef long long[::1] idx = self._indices(indices)
        if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype == np.float64:
            vals_arr = np.ascontiguousarray(values)
        else:
            vals_arr = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
        if vals_arr.shape[0] == 1 and idx.shape[0] != 1:
            vals_arr = np.full(idx.shape[0], vals_arr[0])
        if vals_arr.shape[0] != idx.shape[0]:
            raise ValueError(f"update got {idx.shape[0]} indices but {vals_arr.shape[0]} values")
        cdef double[::1] vals = vals_arr
        cdef Py_ssize_t n = idx.shape[0], k, c, j, d, base, bad = -1
        with nogil:
            for k in range(n):
                if not vals[k] >= 0.0:  # NaN fails every comparison
                    bad = k
                    break
        if bad >= 0:
            raise ValueError(
                f"priority {vals_arr[bad]} at position {bad} of the batch is invalid: priorities "
                "must be non-negative numbers (check the TD errors for NaN)"
            )
        cdef long long[::1] nodes = self._scratch_nodes(n)
        cdef double[::1] tree = self.tree
        cdef bint is_min = self.is_min
        cdef double acc
        with nogil:
            for k in range(n):
                tree[idx[k]] = vals[k]  # level 0 starts at offset 0
                nodes[k] = idx[k]
                PREFETCH_WRITE(&tree[self.offsets[1] + (idx[k] >> 3)])
            for d in range(1, self.depth + 1):  # climb one level for every index before the next
                for k in range(n):
                    j = nodes[k] >> 3
                    nodes[k] = j
                    base = self.offsets[d - 1] + 8 * j  # the 8 children: one cache line
                    acc = tree[base]
                    if is_min:
                        for c in range(1, 8):
                            acc = _min(acc, tree[base + c])
                    else:
                        for c in range(1, 8):
                            acc = acc + tree[base + c]
                    tree[self.offsets[d] + j] = acc
                    if d < self.depth:
                        PREFETCH_WRITE(&tree[self.offsets[d + 1] + (j >> 3)])

    def get(self, indices):
        """The leaf values at `indices` (a numpy array of the same shape)."""
        shape = np.shape(indices)
        idx = self._indices(indices)
        return np.asarray(self.tree)[idx].reshape(shape)

    def __getitem__(self, index):
        return self.get(index)

    def reduce(self, Py_ssize_t start=0, end=None):
        """Sum (or min) over leaves [start, end); the whole tree by default."""
        cdef Py_ssize_t stop = self.capacity if end is None else end
        if not 0 <= start <= stop <= self.capacity:
            raise ValueError(f"range [{start}, {stop}) is not within [0, {self.capacity}]")
        if start == 0 and stop == self.capacity:  # the root: the very total find_prefixsum bounds its queries by (the
            return self.tree[self.offsets[self.depth]]  # ragged sum below can differ from it in the last bit)
        cdef double acc = self.neutral, v
        cdef Py_ssize_t lo = start, hi = stop, d = 0
        cdef double[::1] tree = self.tree
        while lo < hi:  # take the ragged ends on this level, then whole groups of 8 one level up
            while lo < hi and (lo & 7):
                v = tree[self.offsets[d] + lo]
                acc = _min(acc, v) if self.is_min else acc + v
                lo += 1
            while lo < hi and (hi & 7):
                hi -= 1
                v = tree[self.offsets[d] + hi]
                acc = _min(acc, v) if self.is_min else acc + v
            lo >>= 3
            hi >>= 3
            d += 1
        return acc


cdef class SumTree(_SegmentTree):
    """Sum segment tree: `sum()`, range sums, and batched prefix-sum search for proportional sampling."""

    def __init__(self, Py_ssize_t capacity):
        self._init(0.0, False)

    def sum(self, Py_ssize_t start=0, end=None):
        """Sum of leaves [start, end)."""
        return self.reduce(start, end)

    def find_prefixsum(self, prefixes):
        """For each prefix p, the smallest index i with  sum(leaves[:i+1]) > p.

        Prefixes must lie in [0, sum()]. A query never lands on a zero-priority leaf while a
        positive one exists (float rounding near the total is steered to the last positive leaf).
        """
        shape = np.shape(prefixes)
        p_arr = np.array(prefixes, dtype=np.float64).reshape(-1)  # a copy: the descent consumes it
        cdef double[::1] p = p_arr
        cdef double[::1] tree = self.tree
        cdef double total = tree[self.offsets[self.depth]]
        cdef Py_ssize_t n = p_arr.shape[0], k, c, d, j, base, chosen, bad = -1
        cdef double v, q
        with nogil:
            for k in range(n):
                if not (p[k] >= 0.0 and p[k] <= total):
                    bad = k
                    break
        if bad >= 0:
            raise ValueError(f"prefix {p_arr[bad]} at position {bad} is outside [0, total={total}]")
        out_arr = np.zeros(n, dtype=np.int64)  # every query starts at the root, entry 0 of the top level
        cdef long long[::1] node = out_arr
        with nogil:
            for d in range(self.depth, 0, -1):  # descend one level for every query before the next
                for k in range(n):
                    base = self.offsets[d - 1] + 8 * node[k]
                    q = p[k]
                    chosen = -1
                    for c in range(8):
                        v = tree[base + c]
                        if q < v:
                            chosen = c
                            break
                        q -= v
                    if chosen < 0:  # rounding carried q past the last child: take the last positive one
                        q = p[k]
                        for c in range(8):
                            v = tree[base + c]
                            if v > 0.0:
                                chosen = c
                                q = nextafter(v, 0.0)
                        if chosen < 0:
                            chosen = 0
                    p[k] = q
                    j = 8 * node[k] + chosen
                    node[k] = j
                    if d > 1:
                        PREFETCH_READ(&tree[self.offsets[d - 2] + 8 * j])
        return out_arr.reshape(shape)

    def sample_stratified(self, Py_ssize_t batch_size, rng):
        """`batch_size` indices, one drawn proportionally from each of `batch_size` equal slices of the mass."""
        cdef double total = self.tree[self.offsets[self.depth]]
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not total > 0:
            raise ValueError("cannot sample from a sum tree whose total priority is 0 (is the buffer empty?)")
        prefixes = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        np.minimum(prefixes, total, out=prefixes)
        return self.find_prefixsum(prefixes)


cdef class MinTree(_SegmentTree):
    """Min segment tree: `min()` and range minima (the largest importance weight in PER)."""

    def __init__(self, Py_ssize_t capacity):
        self._init(INFINITY, True)

    def min(self, Py_ssize_t start=0, end=None):
        """Minimum of leaves [start, end); +inf where no leaf was set."""
        return self.reduce(start, end)
