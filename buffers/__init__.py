"""Experience storage and its compiled hot loops.

`kernels` (Numba) and `segment_tree` (Cython) are the compiled code; `reference` is their slow,
obvious specification. The buffer classes are schema-driven: a script declares its fields once as
``{name: (per_env_shape, dtype)}`` and the buffer preallocates them.
"""

try:
    from buffers.segment_tree import MinTree, SumTree
except ImportError as e:  # no silent fallback to a slow tree
    raise ImportError(
        "buffers.segment_tree (Cython) is not compiled. Install the package so the extension builds: "
        "`pip install -e .` from the repository root (needs a C compiler and Cython)."
    ) from e

from buffers import kernels, reference
from buffers.episode import EpisodeReplayBuffer, agent_views, team_fields, team_step
from buffers.replay import Priorities, PrioritizedReplayBuffer, ReplayBuffer, joint_fields, joint_transition
from buffers.rollout import RolloutBuffer
from buffers.schema import BufferInputError, Schema, float_tensor, to_torch
from buffers.snapshot import Snapshot

__all__ = [
    "kernels",
    "reference",
    "SumTree",
    "MinTree",
    "BufferInputError",
    "Schema",
    "float_tensor",
    "to_torch",
    "RolloutBuffer",
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "Priorities",
    "joint_fields",
    "joint_transition",
    "EpisodeReplayBuffer",
    "team_fields",
    "team_step",
    "agent_views",
    "Snapshot",
]
