"""Groups that do not learn: frozen to a uniformly random policy (--random-groups), to a checkpoint of any script
(--opponent GROUP=PATH), or to a pool of the run's own past policies (--self-play GROUP).

A frozen group is part of the environment. `FrozenEnv` acts for it and shows the script only the learning groups:
their observations, masks, rewards and terminations (the global state stays the env's own, whole; episode statistics
keep every group's return). So a script holds no code for frozen groups, and a centralized critic conditions on the
actions of the learners only.

Every script names the parts of its acting by their role, with the types below:

    act(...)                                       # the actions of one training step (exploration, what is stored)
    acting(networks, ..., greedy=True) -> MakePolicy              # the networks as a policy: the evaluations' own
    actor(ckpt, group, spec, device, greedy=True) -> MakePolicy   # a checkpoint's group as one (CheckpointActor)
    team_actor(ckpt, specs, device, greedy=True) -> MakePolicy    # its groups `specs` as one, where agents act jointly

    make(num_envs, rng) -> act_fn(obs, done) -> {group: actions}  # a MakePolicy, and the Act it returns

`obs` is an `Observation` holding `group` (at least), `done` the previous step's (E,) done mask (None at the first
step, for actors with a hidden state to reset); the actions are what `env.step` takes for the group. `load_actor`
validates a checkpoint file (env, group shape, weights) and calls the `actor` of the script that wrote it, so a
MAPPO checkpoint can play against an IQL learner. A script whose agents act jointly across groups (a coordination
graph, messages) also has `team_actor`, its `actor` being the one-group case: `load_team` plays several groups of
one checkpoint as trained.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Protocol

import numpy as np
import torch

from envs.api import Observation, StepResult, VecEnv
from runtime.checkpoint import CheckpointError, non_finite, not_a_checkpoint_file, read_checkpoint
from runtime.checks import ArgumentError


class Act(Protocol):
    """One step of a policy: the observation and the previous step's (E,) done mask (None at the first step; a policy
    with hidden states zeroes those of the envs that were done) -> {group: actions as env.step takes them}."""

    def __call__(self, obs: Observation, done: np.ndarray | None) -> dict[str, np.ndarray]: ...


class MakePolicy(Protocol):
    """A policy for `num_envs` envs from fresh hidden states, drawing its random choices from `rng`: what a script's
    `acting(...)` and `actor(...)` return, what `Run`'s `make_greedy` is, and what evaluations play."""

    def __call__(self, num_envs: int, rng: np.random.Generator) -> Act: ...


class CheckpointActor(Protocol):
    """A script's module-level `actor`: group `group` of a checkpoint as a policy for a group shaped `spec` (its
    networks rebuilt with the checkpoint's flags), greedy or sampling. `load_actor` checks the checkpoint first."""

    def __call__(self, ckpt: dict, group: str, spec, device, greedy: bool = True) -> MakePolicy: ...


ALGOS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "algos")
_modules: dict[str, object] = {}


def parse_opponent(
    text: str, flag: str = "--opponent", key: str = "GROUP", example: str = "blue"
) -> tuple[str, str, str]:
    """'GROUP=PATH' or 'GROUP=PATH@CKPT_GROUP' -> (group, path, the checkpoint's group that plays it). A bad one is
    refused in the words of the flag that gave it (results/tournament.py's --player NAME=PATH reads the same way)."""
    group, sep, rest = text.partition("=")
    if not sep or not group or not rest:
        raise ArgumentError(f"{flag} {text!r} is not {key}=PATH (e.g. {example}=runs/x/last.pt, or "
                            f"{example}=runs/x/last.pt@red for the checkpoint's red group)")  # fmt: skip
    path, at, source = rest.rpartition("@") if "@" in os.path.basename(rest) else (rest, "", "")
    return group, path, (source if at else group)


def script_module(algo: str):
    """The module of the script that writes `algo` checkpoints: the running script if it is that one, else
    algos/<algo>.py beside this package."""
    if algo in _modules:
        return _modules[algo]
    running = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    path = running if os.path.basename(running) == f"{algo}.py" else os.path.join(ALGOS_DIR, f"{algo}.py")
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoints of {algo!r} need its script {path}, which does not exist")
    spec = importlib.util.spec_from_file_location(f"_actor_{algo}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "actor"):
        raise CheckpointError(f"{path} has no actor() function: its checkpoints cannot play a group")
    _modules[algo] = module
    return module


def group_signature(spec) -> list:
    """What a group's actor depends on (the entry of `env_signature` for the group)."""
    return [spec.n_agents, list(spec.obs_shape), spec.discrete, spec.action_dim]


def load_actor(
    path: str, env_id: str, spec, source: str, device, greedy: bool = True, ckpt: dict | None = None
) -> MakePolicy:
    """Group `source` of the checkpoint at `path` (or the dict `ckpt`) as an actor for a group shaped `spec`:
    `make(num_envs, rng) -> act(obs, done) -> actions`, acting on `obs.obs[source]`. Every mismatch is one line."""
    ckpt = checked_checkpoint(path, env_id, {source: spec}, ckpt)
    script = script_module(ckpt["algo"])
    return built(path, ckpt, lambda: script.actor(ckpt, source, spec, device, greedy))


def load_team(path: str, env_id: str, specs: dict, device, greedy: bool = True, ckpt: dict | None = None) -> MakePolicy:
    """The checkpoint's groups `specs` (group -> the spec of the env's group of that name) as one policy, acting as
    they were trained together: by the script's `team_actor` where its agents act jointly across groups (dcg's
    coordination graph, the messages of commnet, ic3net and tarmac), else each group by its `actor`, each with its
    own random stream. On every group of its run, it plays what the run's own evaluations played (a probe of a
    two-group team: probes/comm_probe.py); `actor` alone would cut a joint team at its groups' borders."""
    ckpt = checked_checkpoint(path, env_id, specs, ckpt)
    script = script_module(ckpt["algo"])
    specs = {g: specs[g] for g in ckpt["signature"] if g in specs}  # the training's order of groups
    if hasattr(script, "team_actor"):
        return built(path, ckpt, lambda: script.team_actor(ckpt, specs, device, greedy))
    makers = [built(path, ckpt, lambda g=g, s=s: script.actor(ckpt, g, s, device, greedy)) for g, s in specs.items()]

    def make(num_envs, rng):
        streams = rng.integers(2**63, size=len(makers))  # a stream of its own for each group (numpy 1.24: no spawn)
        acts = [m(num_envs, np.random.default_rng(s)) for m, s in zip(makers, streams, strict=True)]
        return lambda obs, done: {g: a for act in acts for g, a in act(obs, done).items()}

    return make


def checked_checkpoint(path: str, env_id: str, specs: dict, ckpt: dict | None = None) -> dict:
    """The checkpoint at `path` (or `ckpt`), checked to play the groups `specs` (the checkpoint's group -> the spec
    of the group it would play) on `env_id`: a CheckpointError of one line for every mismatch."""
    ckpt = read_checkpoint(path) if ckpt is None else ckpt
    if not all(k in ckpt for k in ("algo", "env_id", "signature", "args", "nets")):
        raise CheckpointError(f"checkpoint {path} is not a checkpoint of these scripts (it lacks algo, env_id, "
                              f"signature, args or nets)")  # fmt: skip
    if ckpt["env_id"] != env_id:
        raise CheckpointError(f"checkpoint {path} was trained on {ckpt['env_id']}, not {env_id}: an opponent "
                              f"plays the env it learned")  # fmt: skip
    groups = [g for g in ckpt["signature"] if g != "state_shape"]
    args = ckpt["args"]
    frozen = [
        *args.get("random_groups", []),
        *(o.partition("=")[0] for o in args.get("opponent", [])),
        args.get("self_play"),
    ]
    for source, spec in specs.items():
        if source not in groups:
            why = " (it did not learn there: it was frozen)" if source in frozen else ""
            raise CheckpointError(f"checkpoint {path} has no trained group {source!r}{why}; its groups are {groups}: "
                                  f"pick one with GROUP=PATH@CKPT_GROUP")  # fmt: skip
        if ckpt["signature"][source] != group_signature(spec):
            raise CheckpointError(f"checkpoint {path}: its group {source!r} has [agents, observation shape, discrete, "
                                  f"actions] {ckpt['signature'][source]}, but the group {spec.name!r} it would play "
                                  f"has {group_signature(spec)}")  # fmt: skip
    if bad := non_finite(ckpt["nets"]):
        raise CheckpointError(f"checkpoint {path} holds non-finite weights ({', '.join(bad[:3])})")
    return ckpt


def built(path: str, ckpt: dict, build) -> MakePolicy:
    """`build()` (a script's actor or team_actor on `ckpt`), its failure to fit the script's networks one line."""
    try:
        return build()
    except (RuntimeError, KeyError, ValueError, TypeError) as e:  # another layout, or an older version's
        detail = " ".join(str(e).split())[:200]
        raise CheckpointError(f"checkpoint {path} does not fit {ckpt['algo']}.py's networks ({type(e).__name__}: "
                              f"{detail})") from None  # fmt: skip


def random_actor(spec):
    """A uniformly random policy: over the available actions (discrete), or in the action bounds (continuous)."""

    def make(num_envs, rng):
        def act(obs, done):
            shape = (*obs.agent_mask[spec.name].shape, spec.action_dim)
            if not spec.discrete:
                return {spec.name: rng.uniform(spec.action_low, spec.action_high, shape).astype(np.float32)}
            avail = obs.avail_actions.get(spec.name)
            return {spec.name: np.argmax(rng.random(shape) * (1 if avail is None else avail), -1)}

        return act

    return make


def renamed(obs: Observation, group: str, source: str) -> Observation:
    """`obs` with group `group`'s arrays also under the name `source` (a red actor playing blue reads obs['red'])."""
    if group == source:
        return obs
    avail = {source: obs.avail_actions[group]} if group in obs.avail_actions else {}
    pos = {source: obs.positions[group]} if group in obs.positions else {}
    return Observation({source: obs.obs[group]}, obs.state, {source: obs.agent_mask[group]}, avail, pos)


class Frozen:
    """The actors of the frozen groups of one vector of envs, each with its own hidden state and random stream."""

    def __init__(self, makers: dict, num_envs: int, seed: int):
        self.makers = makers  # group -> (make, the checkpoint's group it reads)
        self.num_envs, self.seed, self.swaps = num_envs, seed, 0
        self.acts = {g: make(num_envs, np.random.default_rng([seed, i])) for i, (g, (make, _)) in
                     enumerate(makers.items())}  # fmt: skip

    def set(self, group: str, make, source: str) -> None:
        """Replace a group's actor (self-play: the next pool member), from a zero hidden state."""
        self.makers[group], self.swaps = (make, source), self.swaps + 1
        self.acts[group] = make(self.num_envs, np.random.default_rng([self.seed, 10_000 + self.swaps]))

    @torch.no_grad()
    def actions(self, obs: Observation, done) -> dict:
        return {g: self.acts[g](renamed(obs, g, source), done)[source] for g, (_, source) in self.makers.items()}


class FrozenEnv(VecEnv):
    """`env` with its frozen groups played by `Frozen` actors; the script sees and steps the learning groups."""

    def __init__(self, env: VecEnv, frozen: Frozen):
        self.env, self.frozen = env, frozen
        self.all_groups = env.groups
        self.groups = {g: s for g, s in env.groups.items() if g not in frozen.makers}
        self.num_envs, self.state_shape, self.max_steps = env.num_envs, env.state_shape, env.max_steps
        self._obs, self._done = None, None

    def learners(self, obs: Observation) -> Observation:
        keep = self.groups
        return Observation({g: obs.obs[g] for g in keep}, obs.state, {g: obs.agent_mask[g] for g in keep},
                           {g: a for g, a in obs.avail_actions.items() if g in keep},
                           {g: a for g, a in obs.positions.items() if g in keep})  # fmt: skip

    def reset(self, seed=None) -> Observation:
        self._obs, self._done = self.env.reset(seed), None
        return self.learners(self._obs)

    def step(self, actions) -> StepResult:
        if not isinstance(actions, dict):
            raise ValueError(f"actions must be a dict group -> array over the learning groups {list(self.groups)}")
        if frozen := [g for g in actions if g in self.frozen.makers]:
            raise ValueError(f"actions given for the frozen group(s) {frozen}: their actors act for them")
        step = self.env.step(actions | self.frozen.actions(self._obs, self._done))
        self._obs, self._done = step.next, step.done
        keep = self.groups
        return StepResult(self.learners(step.next), {g: step.rewards[g] for g in keep},
                          {g: step.terminated[g] for g in keep}, step.truncated, step.done,
                          self.learners(step.final), step.episodes)  # fmt: skip

    def render(self, env_index: int = 0):
        return self.env.render(env_index)

    def close(self) -> None:
        self.env.close()


def frozen_groups(args, groups: dict, device) -> dict:
    """The frozen groups of these flags: group -> (make, source group), checked against the env's `groups`."""
    opponents = [parse_opponent(o) for o in getattr(args, "opponent", ())]
    self_play = getattr(args, "self_play", None)
    named = [*args.random_groups, *(g for g, _, _ in opponents), *([self_play] if self_play else [])]
    for flag, names in (("--random-groups", args.random_groups), ("--opponent", [g for g, _, _ in opponents]),
                        ("--self-play", [self_play] if self_play else [])):  # fmt: skip
        if unknown := [g for g in names if g not in groups]:
            hint = "name one of them" if len(groups) > 1 else "one team, nothing to freeze: drop the flag"
            raise ArgumentError(f"{flag} {unknown}: {args.env_id} has the groups {list(groups)}; {hint}")
    if twice := sorted({g for g in named if named.count(g) > 1}):
        raise ArgumentError(f"the group(s) {twice} are frozen twice (--random-groups, --opponent, --self-play): "
                            f"give each group one of them")  # fmt: skip
    if len(set(named)) == len(groups):
        raise ArgumentError(f"--random-groups/--opponent/--self-play freeze every group of {args.env_id}: nothing "
                            f"would learn")  # fmt: skip
    makers = {g: (random_actor(groups[g]), g) for g in args.random_groups}
    for g, path, source in opponents:
        if problem := not_a_checkpoint_file(path):
            raise ArgumentError(f"--opponent {g}={path}: {problem}")
        sample = getattr(args, "opponent_sample", False)
        makers[g] = (load_actor(path, args.env_id, groups[g], source, device, greedy=not sample), source)
    if self_play:  # until the run adds its first snapshot: the uniform policy
        makers[self_play] = (random_actor(groups[self_play]), self_play)
    return makers


def self_play_source(args, env: FrozenEnv) -> str:
    """The learning group whose past policies play --self-play's group: the one learner of the same shape."""
    want = group_signature(env.all_groups[args.self_play])
    same = [g for g, s in env.groups.items() if group_signature(s) == want]
    if len(same) != 1:
        raise ArgumentError(f"--self-play {args.self_play}: it needs exactly one learning group of the same shape, and "
                            f"{args.env_id} has {same or 'none'} (learning groups: {list(env.groups)})")  # fmt: skip
    return same[0]
