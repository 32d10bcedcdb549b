"""The flags every script shares, the CLI shell around `main(args)`, seeding, and env construction."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import platform
import random
import sys
import warnings
from dataclasses import dataclass
from typing import Annotated, Literal

import gymnasium as gym
import numba
import numpy as np
import torch
import tyro

import envs
from envs.relations import WithRelations
from runtime.checkpoint import CheckpointError, read_checkpoint
from runtime.checks import CheckpointPlayed, RunFinished, RunStopped


@dataclass
class RunArgs:
    """Flags of every script: the env, the budget, the device, logging, checkpoints and evaluation."""

    env_id: Annotated[str, tyro.conf.arg(aliases=("--env",))] = "simple_spread_v3"
    """environment id (see envs.known_ids(), or a Gymnasium id for the single-agent scripts); --env is an alias"""
    seed: int = 1
    """seed of numpy, torch and the envs (env i of the training envs: seed + i)"""
    total_timesteps: int = 10_000_000
    """env steps, summed over all envs, in whole steps of the vector: off-policy scripts round it up to a multiple of
    --num-envs, on-policy ones down to whole rollouts (--num-envs x --num-steps)"""
    num_envs: int = 128
    """parallel training envs"""
    cuda: bool = False
    """train on CUDA (an error if no device is available)"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic"""
    torch_threads: int = 1
    """torch CPU threads (0: torch's default); 1 is fastest for small networks beside the envs"""
    track: bool = False
    """log to Weights & Biases (TensorBoard is always written)"""
    wandb_project_name: str = "flashmarl"
    """Weights & Biases project (with --track)"""
    wandb_entity: str | None = None
    """Weights & Biases team or user (with --track)"""
    capture_video: bool = False
    """record a greedy episode at each evaluation (or with --eval-checkpoint): mp4 in the run dir and TensorBoard"""
    save_model: bool = True
    """write best.pt at each best evaluation (last.pt is always written: at the start, at every evaluation, every
    --checkpoint-minutes, on Ctrl-C/SIGTERM and at the end)"""
    checkpoint_minutes: float = 5.0
    """wall-clock minutes between two writes of last.pt (a kill -9 loses at most this much training)"""
    eval_interval: int = 100_000
    """env steps between greedy evaluations on fresh episodes (0: only at the end)"""
    eval_episodes: int = 10
    """episodes per periodic evaluation (and per --eval-checkpoint)"""
    final_eval_episodes: int = 1000
    """episodes of the final policy's evaluation on the fixed episode set shared by every algorithm and seed
    (env i seeded 10000 + i; written to final_eval.json; 0: skip)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint greedily on the fixed episode set and exit"""
    resume: str | None = None
    """continue the run in this run directory from its last.pt, with its flags (flags given here override them)"""
    run_dir: str | None = None
    """where to write (default runs/<env>__<algo>__<seed>__<time>); refused if it already holds a run"""


@dataclass
class MultiAgentArgs(RunArgs):
    """RunArgs plus the flags of our multi-agent envs (envs.make)."""

    backend: Literal["auto", "numba", "native", "pettingzoo"] = "auto"
    """env backend: 'numba' (compiled MPE), 'native' (MAgent2's engine), 'pettingzoo', or 'auto' (numba for MPE ids,
    native for MAgent2 ids)"""
    vector: Literal["sync", "subproc"] = "sync"
    """PettingZoo vectorization: 'sync' or 'subproc' (worker processes)"""
    continuous_actions: bool = False
    """continuous (Box) actions, for MPE envs"""
    max_cycles: int | None = None
    """episode length limit passed to the env (default: the env's own)"""
    map_size: int | None = None
    """MAgent2 map size (default: the env's own)"""
    env_kwargs: str = "{}"
    """further env keyword arguments as a JSON object, e.g. '{"N": 5}'"""
    relations: bool = False
    """each agent also observes, per landmark, its own distance and the nearest other agent's, computed from its
    observation (envs/relations.py): what lets MAPPO spread 6 agents on simple_spread_v3 (results/simple_spread_v3/
    agents.md); for envs that declare their observation layout"""
    random_groups: tuple[str, ...] = ()
    """groups frozen to a uniformly random policy, e.g. adversary"""
    opponent: tuple[str, ...] = ()
    """groups frozen to a checkpoint of any script: GROUP=PATH (the checkpoint's group of that name plays it) or
    GROUP=PATH@CKPT_GROUP, e.g. blue=runs/x/last.pt@red; several: --opponent red=a.pt blue=b.pt"""
    opponent_sample: bool = False
    """--opponent and --self-play policies sample their actions (default: greedy)"""
    self_play: str | None = None
    """a group frozen to a pool of the run's own past policies (of the one learning group of the same shape), e.g.
    blue on battle_v4; it plays the uniform policy until the first snapshot, and in evaluations"""
    self_play_interval: int = 200_000
    """--self-play: env steps between two snapshots; at each, the pool gains the learner's policy and the group
    draws its next opponent from the pool (uniformly)"""
    self_play_pool: int = 10
    """--self-play: the pool holds the last this many snapshots (all are kept in <run dir>/pool/)"""


def flag_value(argv, name):
    """The value of `--name VALUE` or `--name=VALUE` in argv (the last one given), else None."""
    value = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def checkpoint_defaults(args_class, argv, algo: str | None = None):
    """With --resume DIR or --eval-checkpoint PATH on the command line: the flags that checkpoint was trained with,
    as defaults that the command line overrides. So `--resume DIR` alone continues the same run (budget included),
    and `--eval-checkpoint PATH` alone rebuilds the networks it holds. None without either flag. A checkpoint of
    another script than `algo` is refused here, naming the script that reads it, before its flags build anything."""
    run_dir, path = flag_value(argv, "--resume"), flag_value(argv, "--eval-checkpoint")
    if run_dir is not None:
        if os.path.isfile(run_dir):  # its last.pt, say: the folder is meant
            raise CheckpointError(f"--resume {run_dir}: a file; --resume takes the run directory that holds last.pt "
                                  f"(--resume {os.path.dirname(run_dir) or '.'})")  # fmt: skip
        if not os.path.isdir(run_dir):
            raise CheckpointError(f"--resume {run_dir}: no such run directory")
        path = os.path.join(run_dir, "last.pt")
        if not os.path.isfile(path):
            raise CheckpointError(f"--resume {run_dir}: it holds no last.pt to continue from (start a new run)")
    elif path is None or not os.path.isfile(path):
        return None  # no checkpoint, or one that does not exist: check_args names it
    ckpt = read_checkpoint(path)
    if algo is not None and isinstance(ckpt.get("algo"), str) and ckpt["algo"] != algo:
        todo = "continue it" if run_dir else "play it"
        raise CheckpointError(f"checkpoint {path} is not a {algo} checkpoint but a {ckpt['algo']} one: {todo} with "
                              f"algos/{ckpt['algo']}.py")  # fmt: skip
    saved = ckpt.get("args")
    if not isinstance(saved, dict):  # not one of ours, or damaged: the script's load names what is wrong
        return None
    given = next((v for name in ("--env-id", "--env_id", "--env") if (v := flag_value(argv, name))), None)
    if given is not None and saved.get("env_id") not in (None, given):  # its networks and env flags are another env's
        raise CheckpointError(f"{path} was trained on {saved['env_id']}, not {given}: drop --env-id (it plays the env "
                              f"it was trained on), or pick a checkpoint trained on {given}")  # fmt: skip
    how_run = ("capture_video", "track", "eval_episodes", "final_eval_episodes", "cuda", "torch_threads")
    return checkpoint_args(args_class, saved, () if run_dir else how_run)  # an evaluation: networks and env only


def checkpoint_args(args_class, saved: dict, skip=()):
    """`args_class` with the flags `saved` in a checkpoint (but `skip`); run dir, resume and eval checkpoint unset.
    A script's actor() rebuilds its networks from these. A flag a checkpoint predates takes the value it then had,
    from `args_class.BEFORE_FLAGS` where a script declares one (a default changed since)."""
    fields = {f.name for f in dataclasses.fields(args_class) if f.init} - set(skip)
    saved = {**getattr(args_class, "BEFORE_FLAGS", {}), **saved}
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k in fields}
    kwargs.update(run_dir=None, resume=None, eval_checkpoint=None)  # the command line says where, and what to do
    return args_class(**kwargs)


def cli(args_class, main):
    """Parse the flags and run `main(args)`; every expected failure ends in one `error:` line (exit 2), a stop
    request in one line (exit 130), never a traceback."""
    try:
        defaults = checkpoint_defaults(args_class, sys.argv[1:], main.__globals__.get("ALGO"))  # the script's name
        args = tyro.cli(args_class, default=defaults) if defaults is not None else tyro.cli(args_class)
        main(args)
    except CheckpointPlayed:  # --eval-checkpoint: Run printed the checkpoint's returns
        return
    except RunFinished as e:  # --resume of a finished run: nothing to do, and nothing rewritten
        print(e)
    except RunStopped as e:
        print(e)
        sys.exit(130)
    except KeyboardInterrupt:  # before a Run took over the signals: nothing was written yet
        print("interrupted: stopped before a run directory held anything to continue from")
        sys.exit(130)
    except (ValueError, ImportError, FloatingPointError, OSError, envs.EnvWorkerError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def keep_freed_memory() -> bool:
    """Have glibc's malloc serve every block from its heap and keep what is freed there for reuse.

    By default glibc maps a block over its mmap threshold (128 kB, raised on the fly up to 32 MB) afresh and hands
    it back to the OS on free, and trims the heap's free top, so a tensor of a few MB (a PPO minibatch's
    activations; on MAgent2's battle, hundreds of MB) is page-faulted in again at most allocations: a 160k-step
    MAPPO run at our defaults takes 4.5x the page faults. The learning is the same to the bit; a process keeps the
    memory of its peak (2x on battle_v4). results/speed/malloc.md and battle.md measure both. Returns whether it
    applied: not without glibc, nor where the environment tunes glibc's malloc itself (MALLOC_MMAP_THRESHOLD_,
    MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_, or glibc.malloc in GLIBC_TUNABLES), nor with
    FLASHMARL_MALLOC=glibc (glibc's defaults).
    """
    tunables = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
    if platform.libc_ver()[0] != "glibc" or os.environ.get("FLASHMARL_MALLOC") == "glibc":
        return False
    if any(k in os.environ for k in tunables) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    mallopt = ctypes.CDLL(None).mallopt
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


def setup(args):
    """Threads, seeds and device, in the order every script uses: returns (device, numpy Generator). (check_args
    has refused --cuda without a device.) Also keeps freed memory for reuse (`keep_freed_memory`), and says so in
    one line where Numba's compilation is off."""
    keep_freed_memory()
    if numba.config.DISABLE_JIT:  # every @njit function then runs as the plain Python it reads as
        warnings.warn("NUMBA_DISABLE_JIT is set: the compiled kernels (Numba MPE, GAE, the GRU, acting) run as plain "
                      "Python, with the same results, many times slower; unset it for speed", stacklevel=2)  # fmt: skip
    elif cold := uncompiled_kernels(getattr(args, "env_id", "")):
        when = "up to a minute on 2 cores before the first step; later runs load them from Numba's cache"
        print(f"compiling the Numba kernels of {', '.join(cold)} once for this install: {when}", flush=True)
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    return torch.device("cuda" if args.cuda else "cpu"), np.random.default_rng(args.seed)


# the compiled env of each family that has one: its kernel module, and what a fresh install is told it is
PORT_KERNELS = {
    "mpe": ("envs/mpe/kernels.py", "the MPE physics"),
    "lbf": ("envs/foraging_numba.py", "the LBF port"),
    "rware": ("envs/warehouse_numba.py", "the RWARE port"),
}


def uncompiled_kernels(env_id: str, root: str | None = None) -> list[str]:
    """The kernel modules a run of `env_id` compiles that Numba's cache (beside each module, in __pycache__) does not
    hold yet: a fresh install's first run. [] where the cache is elsewhere (NUMBA_CACHE_DIR): it cannot tell."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return []
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    modules = {"buffers/kernels.py": "the buffers"}
    if (entry := envs.lookup(env_id)) is not None and entry.family in PORT_KERNELS:
        path, name = PORT_KERNELS[entry.family]
        modules[path] = name
    cold = []
    for module, name in modules.items():
        folder, stem = os.path.split(os.path.join(root, module))
        cache = os.path.join(folder, "__pycache__")
        files = os.listdir(cache) if os.path.isdir(cache) else []
        if not any(f.startswith(stem[:-3] + ".") and f.endswith(".nbi") for f in files):
            cold.append(name)
    return cold


def env_kwargs(args) -> dict:
    """--env-kwargs (JSON) merged with the env flags that were given."""
    try:
        kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as e:
        raise ValueError(f"--env-kwargs is not valid JSON ({e}); use e.g. '{{\"N\": 5}}'") from None
    if not isinstance(kwargs, dict):
        raise ValueError(f"--env-kwargs must be a JSON object such as '{{\"N\": 5}}', not {args.env_kwargs!r}")
    flags = dict(continuous_actions=args.continuous_actions or None, max_cycles=args.max_cycles, map_size=args.map_size)
    given = {k: v for k, v in flags.items() if v is not None}
    for key in given.keys() & kwargs.keys():  # the flag would win without a word
        if given[key] != kwargs[key]:
            raise ValueError(f"--{key.replace('_', '-')} {given[key]} and --env-kwargs' {key} {kwargs[key]} disagree: "
                             f"give it once")  # fmt: skip
    return kwargs | given


SINGLE_AGENT_SCRIPTS = "algos/ppo.py, dqn.py or drqn.py"


def make_env(args, num_envs, seed, backend=None, vector=None):
    """envs.make with the script's env flags (`backend`/`vector` default to --backend/--vector), its frozen groups
    played by their actors (runtime.opponents): the script sees the learning groups."""
    try:
        env = envs.make(args.env_id, num_envs, seed, vector=vector or args.vector, backend=backend or args.backend,
                        **env_kwargs(args))  # fmt: skip
    except envs.UnknownEnvError as e:
        # a Gymnasium id, where the registry has no nearer guess (an LBF or RWARE package's own id is in Gymnasium's
        # registry too, once the package is imported: the registry names ours)
        if args.env_id in gym.registry and not e.near_miss:
            raise ValueError(f"{args.env_id!r} is a single-agent Gymnasium id: train it with {SINGLE_AGENT_SCRIPTS}, "
                             f"not a multi-agent script") from None  # fmt: skip
        raise
    except envs.EnvArgumentError as e:  # the usual case: an env without a continuous_actions argument
        if not (args.continuous_actions and "continuous_actions" in str(e)):
            raise
        raise ValueError(f"{args.env_id} has no continuous actions ({e}); use --no-continuous-actions") from None
    try:
        return freeze(args, WithRelations(env, args.env_id) if args.relations else env, seed)
    except BaseException:
        env.close()
        raise


def make_eval_env(args, num_envs, seed):
    """The standard env of evaluation protocol v2, in this process: PettingZoo's, stepped through its engine for
    MAgent2 ids (backend 'native', equal to it bit for bit and ~2.6x faster; tests/test_magent_native.py); a
    single-agent script's (RunArgs without the multi-agent flags) Gymnasium env."""
    if not isinstance(args, MultiAgentArgs):
        return make_gym_env(args, num_envs, seed)

    magent = (entry := envs.lookup(args.env_id)) is not None and entry.family == "magent"
    return make_env(args, num_envs, seed, "native" if magent else "pettingzoo", "sync")


def freeze(args, env, seed):
    """`env` with the groups of --random-groups, --opponent and --self-play acted for (a FrozenEnv), else `env`."""
    from runtime.opponents import Frozen, FrozenEnv, frozen_groups

    if not (args.random_groups or args.opponent or args.self_play):
        return env
    makers = frozen_groups(args, env.groups, torch.device("cuda" if args.cuda else "cpu"))
    return FrozenEnv(env, Frozen(makers, env.num_envs, seed))


def make_gym_env(args, num_envs, seed, **kwargs):
    """envs.make_gym, with Gymnasium's registry errors turned into one clear message."""
    try:
        return envs.make_gym(args.env_id, num_envs, seed, **kwargs)
    except (gym.error.UnregisteredEnv, gym.error.DeprecatedEnv, gym.error.NameNotFound) as e:
        if ":" not in args.env_id and envs.unknown_id(args.env_id) is None:
            raise ValueError(f"{args.env_id!r} is a multi-agent env of envs.make, not a Gymnasium id: train it with a "
                             f"multi-agent script of algos/ (mappo.py, qmix.py, ...)") from None  # fmt: skip
        raise ValueError(
            f"unknown env id {args.env_id!r}: {e} (any registered Gymnasium id, e.g. CartPole-v1)"
        ) from None
    except gym.error.DependencyNotInstalled as e:
        raise ImportError(f"{args.env_id} needs an extra package: {e}") from None


def env_signature(env) -> dict:
    """What a checkpoint must match: groups, agent counts, observation, action and state spaces."""
    if isinstance(env, gym.vector.VectorEnv):
        space = env.single_action_space
        if isinstance(space, gym.spaces.Discrete):
            action = ["discrete", int(space.n)]
        elif isinstance(space, gym.spaces.Box):
            action = ["box", list(space.shape), space.low.tolist(), space.high.tolist()]
        else:
            raise ValueError(f"supported action spaces are Discrete and Box, but this env has {space}")
        return {"obs_shape": list(env.single_observation_space.shape), "action_space": action}
    sig = {g: [s.n_agents, list(s.obs_shape), s.discrete, s.action_dim] for g, s in env.groups.items()}
    return sig | {"state_shape": list(env.state_shape)}
