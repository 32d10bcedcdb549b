"""The nine mpe2 (PettingZoo MPE) environments, re-implemented in Numba and batched over envs.

    from envs.mpe import make_vec, parallel_env
    env = make_vec("simple_spread_v3", num_envs=1024, seed=0)      # envs.api.VecEnv
    pz = parallel_env("simple_tag_v3", continuous_actions=True)     # pettingzoo.ParallelEnv

Design. A world is a handful of float64 arrays batched over envs (`physics.WorldState`:
positions, velocities, utterances, goal indices, step counts, returns, one RNG state per env)
plus a static description shared by all envs (`physics.WorldSpec`: sizes, which entities move
and collide, speed limits, action and observation layouts). One compiled call,
`kernels.step_envs`, steps all E worlds: it decodes actions, runs mpe2's physics
(`physics.world_step`), computes the scenario's rewards and observations (`scenarios`), handles
truncation and auto-reset, and writes straight into the arrays `MPEVecEnv.step` hands back.
Python only routes group arrays in and wraps arrays in the `envs.api` dataclasses.

Fidelity. Physics, action decoding (both discrete and continuous, communication included),
observations, rewards and truncation follow mpe2 1.1.1 operation by operation in float64;
tests/test_numba_mpe.py copies mpe2 worlds in and checks 1,000 random steps per scenario and
action type to 1e-5. Reset distributions match (uniform ranges and goal choices) but not mpe2's
random streams: each env has its own SplitMix64 stream, seeded from seed + env index.

Modules: `physics` (world state, RNG, actions, World.step), `scenarios` (the nine scenarios),
`kernels` (batched reset/observe/step), `vec_env` (`MPEVecEnv`, `make_vec`), `parallel`
(`MPEParallelEnv`, `parallel_env`), `mpe2_bridge` (copy worlds to and from mpe2; rendering).
"""

import hashlib
from pathlib import Path


def _drop_stale_numba_cache() -> None:
    """Numba keys a cached function on its own source file only, so `kernels.step_envs` would keep
    old copies of the scenario and physics code it compiled in. Drop the whole cache of this
    package when any of its compiled modules changed (a stamp holds their hash)."""
    here = Path(__file__).parent
    sources = b"".join((here / f).read_bytes() for f in ("physics.py", "scenarios.py", "kernels.py"))
    digest = hashlib.sha256(sources).hexdigest()
    cache = here / "__pycache__"
    stamp = cache / "numba_sources.sha256"
    if stamp.is_file() and stamp.read_text() == digest:
        return
    try:
        for f in cache.glob("*.nb[ic]"):
            f.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:  # read-only install: Numba then caches elsewhere and the stamp is moot
        pass


_drop_stale_numba_cache()

from envs.mpe.parallel import MPEParallelEnv, parallel_env  # noqa: E402
from envs.mpe.scenarios import SCENARIOS  # noqa: E402
from envs.mpe.vec_env import MPEVecEnv, make_vec  # noqa: E402

__all__ = ["SCENARIOS", "MPEParallelEnv", "MPEVecEnv", "make_vec", "parallel_env"]
