"""Environment ids, and `make`: the one entry point that turns an id into a `VecEnv`.

Known ids come from three families of PettingZoo parallel envs, plus any parallel env named by its
import path:

* MPE from the `mpe2` package (never `pettingzoo.mpe`): `simple_spread_v3`, `simple_tag_v3`, ...
  Discrete actions unless `continuous_actions=True`; `N`, `max_cycles`, `local_ratio`, ... pass through.
* MAgent2 gridworlds: `battle_v4`, `adversarial_pursuit_v4`, `tiger_deer_v4`, `gather_v5`,
  `combined_arms_v6`, `battlefield_v5`. `map_size` (where the env has one) and `max_cycles` pass through.
* PettingZoo Butterfly: `cooperative_pong_v6`, `knights_archers_zombies_v11`, `pistonball_v6`
  (the last needs `pymunk`; an id whose package is missing fails with an `EnvNotAvailableError`).
* Level-Based Foraging (`lbforaging`) and the Multi-Robot Warehouse (`rware`), Gymnasium multi-agent
  packages, by the EPyMARL benchmark's task names: `Foraging-2s-8x8-2p-2f-coop`, ..., `rware-tiny-2ag`, ...,
  and any other task the packages register, by its id without the version (`Foraging-5x5-2p-1f`,
  `rware-medium-6ag-hard`: envs/foraging.py, envs/warehouse.py; `max_cycles` passes through). Their time limit
  is a truncation.
* Cooperative matrix games (envs/matrix_games.py): `matrix_qtran`, `matrix_climbing`, `matrix_penalty`
  (`episode_length` for the repeated game, `k` for the penalty game's penalty).
* `"package.module:function"`: any function returning a PettingZoo `ParallelEnv` (an AEC env is
  converted with PettingZoo's `aec_to_parallel`). It is called with the env kwargs as given.

Every failure to build an env is one short exception whose message says what to do:
`UnknownEnvError` (lists the known ids), `EnvArgumentError` (lists the accepted arguments),
`EnvNotAvailableError` (names the missing package or backend).
"""

import functools
import importlib
import inspect
import numbers
import sys
from dataclasses import dataclass

from envs import foraging, matrix_games, warehouse  # the task families hold their task names
from envs.api import VecEnv, refused_arguments
from envs.relations import declare_entities


class UnknownEnvError(ValueError):
    """The env id is neither a registered id nor a `module:function` path. `near_miss`: the message names the one
    id meant (a package's versioned Gymnasium id, an LBF or RWARE task out of the packages' range) instead of listing
    the known ones, so a caller that would add its own guess (a Gymnasium id?) has none to add."""

    def __init__(self, message: str, near_miss: bool = False):
        super().__init__(message)
        self.near_miss = near_miss


class EnvArgumentError(ValueError):
    """The env exists but rejected the keyword arguments it was given."""


class EnvNotAvailableError(ImportError):
    """The env or backend is known but its package is not installed."""


@dataclass(frozen=True)
class EnvEntry:
    """How to build one registered env: the module whose `parallel_env` makes it, and its quirks."""

    family: str  # "mpe", "magent", "butterfly", "lbf", "rware" or "matrix"
    module: str  # import path of the module with a `parallel_env(**kwargs)` function
    min_map_size: int | None = None  # smallest map_size with at least one agent of every team
    state_from_obs: bool = False  # the env's state() is exactly the concatenated observations
    task: str | None = None  # passed as `task=` to `parallel_env`: one module builds many ids (LBF, RWARE)


_MPE = [
    "simple_v3",
    "simple_spread_v3",
    "simple_reference_v3",
    "simple_speaker_listener_v4",
    "simple_adversary_v3",
    "simple_tag_v3",
    "simple_push_v3",
    "simple_crypto_v3",
    "simple_world_comm_v3",
    "collect_treasure_v1",
    "simple_formation_v1",
    "simple_line_v1",
]
# The smallest map sizes: the env's own assert, raised where a smaller map would leave a team with
# zero agents (adversarial_pursuit places 0.0125 * map_size**2 predators, so it needs 9, not 7).
_MAGENT = {
    "battle_v4": 12,
    "adversarial_pursuit_v4": 9,
    "tiger_deer_v4": 10,
    "gather_v5": None,  # fixed 200 x 200 map, no map_size argument
    "combined_arms_v6": 16,
    "battlefield_v5": 46,
}
_BUTTERFLY = ["cooperative_pong_v6", "knights_archers_zombies_v11", "pistonball_v6"]
# PettingZoo >= 1.27 deprecates importing `pettingzoo.butterfly.<id>`; its own registry points at
# the implementation modules, and so do we.

# mpe2's SimpleEnv.state() concatenates every agent's observation in agent order, which is what the
# wrapper builds from the observations it already has; flagging it saves a second observation pass.
REGISTRY: dict[str, EnvEntry] = {
    **{name: EnvEntry("mpe", f"mpe2.{name}", state_from_obs=True) for name in _MPE},
    **{name: EnvEntry("magent", f"magent2.environments.{name}", min_map_size=size) for name, size in _MAGENT.items()},
    **{
        name: EnvEntry("butterfly", f"pettingzoo.butterfly.{base}.{base}")
        for name, base in ((name, name.rsplit("_v", 1)[0]) for name in _BUTTERFLY)
    },
    # neither has a state(): the state is the concatenated observations, as EPyMARL builds it
    **{name: EnvEntry("lbf", "envs.foraging", state_from_obs=True, task=name) for name in foraging.TASKS},
    **{name: EnvEntry("rware", "envs.warehouse", state_from_obs=True, task=name) for name in warehouse.TASKS},
    **{name: EnvEntry("matrix", "envs.matrix_games", state_from_obs=True, task=name) for name in matrix_games.TASKS},
}


# families whose module builds any task of its package by name, beyond the registered ones (the benchmark's)
_TASK_FAMILIES = {"lbf": foraging, "rware": warehouse}


def known_ids() -> list[str]:
    """Every registered env id, grouped by family (MPE, MAgent2, Butterfly, LBF, RWARE); `lookup` also takes any
    other LBF and RWARE task by name."""
    return list(REGISTRY)


def lookup(env_id: str) -> EnvEntry | None:
    """How to build `env_id`: its registered entry, or an LBF or RWARE task outside the benchmark's named by the
    package's grammar; None for any other id. An LBF or RWARE name the package does not build raises
    `UnknownEnvError` saying what it does build."""
    if env_id in REGISTRY:
        return REGISTRY[env_id]
    for family, module in _TASK_FAMILIES.items():
        if module.TASK.fullmatch(env_id):
            try:
                module.task_kwargs(env_id)
            except ValueError as err:
                raise UnknownEnvError(str(err), near_miss=True) from None
            return EnvEntry(family, module.__name__, state_from_obs=True, task=env_id)
    return None


def unknown_id(env_id: str) -> UnknownEnvError | None:
    """The error `make` would raise for `env_id` as an id, its message one line, for checking a flag before anything
    is built (a typo in --env-id): None for a registered id, an LBF or RWARE task the packages build, or a
    "package.module:function" path (imported when built)."""
    if ":" in env_id:
        return None
    try:
        found = lookup(env_id)
    except UnknownEnvError as err:  # an LBF or RWARE name outside the packages' range: it says what they build
        return err
    if found is None:
        return _unknown_id_error(env_id, f"{env_id!r} is not an env id of envs.make (envs.known_ids())")
    return None


def _package_id_hint(env_id: str) -> str | None:
    """For an LBF or RWARE package's own Gymnasium id (EPyMARL's key, `Foraging-8x8-2p-2f-coop-v3`): the id that
    names the task here, without the version; None for any other id."""
    base, sep, version = env_id.rpartition("-v")
    if not (sep and version.isdigit() and base):
        return None
    try:
        entry = lookup(base)
    except UnknownEnvError:
        return None
    if entry is None or entry.family not in _TASK_FAMILIES:
        return None
    return f"{env_id!r} is the package's Gymnasium id; envs.make names the task without its version: {base!r}"


def _unknown_id_error(env_id: str, plain: str | None = None) -> UnknownEnvError:
    """make's error for an id it does not know: the package's versioned id named as ours (a near miss), else
    `plain`, by default every known id by family."""
    if hint := _package_id_hint(env_id):
        return UnknownEnvError(hint, near_miss=True)
    return UnknownEnvError(plain or _known_ids_listed(env_id))


def _known_ids_listed(env_id: str) -> str:
    by_family: dict[str, list[str]] = {}
    for name, entry in REGISTRY.items():
        by_family.setdefault(entry.family, []).append(name)
    for family, module in _TASK_FAMILIES.items():
        by_family[family].append(f"or any {module.GRAMMAR}")
    lines = [f"unknown env id {env_id!r}. Known ids:"]
    lines += [f"  {family}: {', '.join(names)}" for family, names in by_family.items()]
    lines.append('  or any PettingZoo parallel env as "package.module:function", e.g. "mpe2.simple_v3:parallel_env"')
    return "\n".join(lines)


def _import_env_module(module: str, env_id: str):
    try:
        return importlib.import_module(module)
    except ImportError as err:
        missing = getattr(err, "name", None) or str(err)
        raise EnvNotAvailableError(
            f"{env_id} cannot be imported: package {missing!r} is missing ({err}). Install it to use this env."
        ) from None


def _accepted_kwargs(module) -> dict | None:
    """The keyword arguments `module.parallel_env` accepts, each with its default (None where it has none), or None
    when they cannot be listed."""
    for fn in (getattr(module, "parallel_env", None), getattr(module, "raw_env", None)):
        if fn is None:
            continue
        params = inspect.signature(fn).parameters.values()
        named = {
            p.name: None if p.default is p.empty else p.default
            for p in params
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        }
        if not named:  # a `**kwargs` forwarder (mpe2's parallel_env): look at raw_env instead
            continue
        if any(p.kind == p.VAR_KEYWORD for p in params):
            # MAgent2 forwards **kwargs into its reward config; the module lists the legal ones.
            home = sys.modules.get(fn.__module__, module)  # `battle_v4` re-exports `battle.battle`
            extra = getattr(home, "default_reward_args", None) or getattr(home, "default_env_args", None)
            if extra is None:
                return None
            named |= dict(extra)
        return {name: default for name, default in named.items() if name not in ("self", "seed")}
    return None


def build_parallel_env(env_id: str, **env_kwargs):
    """Build one PettingZoo parallel env for `env_id` (a registered id or `module:function`).

    Registered families get `render_mode="rgb_array"` unless told otherwise, so any env can be
    rendered into a video. Bad arguments raise `EnvArgumentError` naming the accepted ones.
    """
    if ":" in env_id:
        return _build_from_path(env_id, env_kwargs)
    entry = lookup(env_id)
    if entry is None:
        raise _unknown_id_error(env_id)
    module = _import_env_module(entry.module, env_id)
    kwargs = {"render_mode": "rgb_array", **env_kwargs}
    accepted = _accepted_kwargs(module)
    if entry.task is not None and accepted is not None:  # the id names the task: not an argument of its own
        accepted.pop("task", None)
    if accepted is not None and (refusal := refused_arguments(env_id, kwargs, accepted)):
        raise EnvArgumentError(refusal)
    if entry.task is not None:
        kwargs["task"] = entry.task
    size = kwargs.get("map_size")
    if entry.min_map_size is not None and size is not None and size < entry.min_map_size:
        raise EnvArgumentError(f"{env_id} needs map_size >= {entry.min_map_size}, got {size}")
    try:
        return module.parallel_env(**kwargs)
    except (TypeError, ValueError, AssertionError) as err:
        raise EnvArgumentError(f"could not build {env_id} with {env_kwargs}: {err}") from None


def _build_from_path(env_id: str, env_kwargs: dict):
    module_name, _, fn_name = env_id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UnknownEnvError(f"cannot import {module_name!r} for env {env_id!r}: {err}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise UnknownEnvError(f"{module_name!r} has no function {fn_name!r} (env id {env_id!r})")
    try:
        env = fn(**env_kwargs)
    except TypeError as err:
        raise EnvArgumentError(f"could not build {env_id} with {env_kwargs}: {err}") from None
    # Imported here: the conversion module pulls in all of PettingZoo's wrappers.
    from pettingzoo.utils.conversions import aec_to_parallel
    from pettingzoo.utils.env import AECEnv

    if isinstance(env, AECEnv):
        env = aec_to_parallel(env)
    return env


def env_factory(env_id: str, **env_kwargs) -> functools.partial:
    """A picklable zero-argument callable that builds the env (what subprocess workers call)."""
    return functools.partial(build_parallel_env, env_id, **env_kwargs)


def make(
    env_id: str,
    num_envs: int = 1,
    seed: int = 0,
    vector: str = "sync",
    backend: str = "pettingzoo",
    num_workers: int | None = None,
    **env_kwargs,
) -> VecEnv:
    """Make `num_envs` copies of a multi-agent env behind the `VecEnv` contract (`envs/api.py`).

    Args:
        env_id: a registered id (see `known_ids()`) or `"package.module:function"` returning a
            PettingZoo parallel env.
        num_envs: E, the number of env copies stepped together.
        seed: env i is reset with `seed + i` at the first `reset()`; later auto-resets continue each
            env's own random generator, so a run is a deterministic function of the seed.
        vector: `"sync"` steps the envs one after another in this process; `"subproc"` steps them
            in worker processes (each holding a block of envs) and moves observations through
            shared memory. Both give identical trajectories. Ignored by the numba backend.
        backend: `"pettingzoo"`, `"numba"` to delegate MPE ids to `envs.mpe.make_vec`, Level-Based Foraging ids
            to `envs.foraging_numba` and RWARE ids to `envs.warehouse_numba`, `"native"` to step MAgent2 ids through
            their engine's team handles (`envs.magent_native`; the same numbers, bit for bit), or `"auto"`: numba for
            the MPE, LBF and RWARE ids it implements, native for MAgent2 ids, pettingzoo for every other id.
        num_workers: `"subproc"` only: the worker processes (default: one per CPU, at most E).
        **env_kwargs: passed to the env constructor (e.g. `N=5`, `max_cycles=50`, `map_size=20`,
            `continuous_actions=True`).

    Returns:
        A `VecEnv`: call `reset()` first, then `step(actions)` (auto-resets finished envs).

    Raises:
        UnknownEnvError, EnvArgumentError, EnvNotAvailableError: with a message saying what to fix.
    """
    env = _make(env_id, num_envs, seed, vector, backend, num_workers, **env_kwargs)
    return declare_entities(env, env_id, env_kwargs)  # where its observations hold which entities, every backend


def _make(env_id, num_envs, seed, vector, backend, num_workers, **env_kwargs) -> VecEnv:
    for name, value, least in (("num_envs", num_envs, 1), ("seed", seed, 0)):  # not '<' between str and int later
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    entry = None if ":" in env_id else lookup(env_id)
    family = entry.family if entry is not None else None
    magent = family == "magent"
    if backend == "auto":
        ported = env_id in _numba_ids() or family in ("lbf", "rware")
        backend = "numba" if ported else "native" if magent else "pettingzoo"
    if backend == "numba" and family in ("lbf", "rware"):
        module = importlib.import_module("envs.foraging_numba" if family == "lbf" else "envs.warehouse_numba")
        try:
            return module.make_vec(env_id, num_envs, seed, **env_kwargs)
        except TypeError as err:
            raise EnvArgumentError(str(err)) from None
    if backend == "numba":
        return _make_numba(env_id, num_envs, seed, **env_kwargs)
    if backend not in ("pettingzoo", "native"):
        raise ValueError(f"unknown backend {backend!r}: use 'pettingzoo', 'numba', 'native' or 'auto'")
    if backend == "native" and not magent:
        raise ValueError(f"backend 'native' steps MAgent2 envs only, and {env_id} is not one: use 'pettingzoo' or "
                         f"'auto'")  # fmt: skip
    if vector not in ("sync", "subproc"):
        raise ValueError(f"unknown vector mode {vector!r}: use 'sync' or 'subproc'")
    # Fail on a bad id before doing any work, with the same message for both vector modes.
    if ":" not in env_id and entry is None:
        raise _unknown_id_error(env_id)
    state_from_obs = entry.state_from_obs if entry is not None else False
    factory = env_factory(env_id, **env_kwargs)
    runner = None
    if backend == "native":
        from envs.magent_native import MagentRunner as runner
    if vector == "sync":
        from envs.pettingzoo_env import SyncVecEnv

        return SyncVecEnv(factory, num_envs, seed, state_from_obs=state_from_obs, runner=runner)
    from envs.subproc import SubprocVecEnv

    kwargs = {} if runner is None else {"runner": runner}
    return SubprocVecEnv(factory, num_envs, seed, state_from_obs=state_from_obs, num_workers=num_workers, **kwargs)


def _numba_ids() -> set[str]:
    """The ids the Numba MPE backend implements (empty when it cannot be imported)."""
    try:
        from envs.mpe import SCENARIOS
    except ImportError:
        return set()
    return set(SCENARIOS)


def _make_numba(env_id: str, num_envs: int, seed: int, **env_kwargs) -> VecEnv:
    """Delegate to the Numba MPE backend (`envs.mpe.make_vec`) when it is installed."""
    try:
        module = importlib.import_module("envs.mpe")
    except ModuleNotFoundError as err:
        if err.name not in ("envs.mpe", "envs"):
            raise  # the backend exists but one of its own imports is missing: show that
        raise EnvNotAvailableError(
            "the Numba MPE backend is not available: envs.mpe could not be imported; use backend='pettingzoo'"
        ) from None
    make_vec = getattr(module, "make_vec", None)
    if make_vec is None:
        raise EnvNotAvailableError(
            "the Numba MPE backend is not available: envs.mpe has no make_vec(env_id, num_envs, seed, **kwargs)"
        )
    try:
        return make_vec(env_id, num_envs, seed, **env_kwargs)
    except (TypeError, NotImplementedError) as err:  # an argument mpe2 does not take, or the port does not
        raise EnvArgumentError(str(err)) from None
