"""MATD3 (Ackermann et al. 2019, arXiv:1910.01465); results: results/simple_spread_v3/matd3.json"""

import copy
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from typing import Annotated

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import envs
from buffers import BufferInputError, PrioritizedReplayBuffer, ReplayBuffer, to_torch

ALGO = "matd3"


@dataclass
class Args:
    # --- shared flags (every script) ---
    env_id: Annotated[str, tyro.conf.arg(aliases=("--env",))] = "simple_spread_v3"
    """environment id (see envs.known_ids()) or 'module:function'; --env is an alias"""
    seed: int = 1
    """seed of numpy, torch and the envs"""
    total_timesteps: int = 10_000_000
    """env steps, summed over all envs"""
    num_envs: int = 128
    """parallel training envs (128: one actor forward and one env call per 128 transitions)"""
    backend: str = "auto"
    """env backend: 'numba' (compiled MPE), 'pettingzoo', or 'auto' (numba for MPE ids when available)"""
    vector: str = "sync"
    """PettingZoo vectorization: 'sync' or 'subproc'"""
    continuous_actions: bool = True
    """continuous (Box) MPE actions, as in published MPE baselines; --no-continuous-actions: discrete, Gumbel-softmax"""
    max_cycles: int | None = None
    """episode length limit passed to the env (default: the env's own)"""
    map_size: int | None = None
    """MAgent2 map size (default: the env's own)"""
    env_kwargs: str = "{}"
    """further env keyword arguments as JSON, e.g. '{"N": 5}'"""
    cuda: bool = False
    """train on CUDA (an error if no device is available)"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic"""
    torch_threads: int = 1
    """torch CPU threads (0: torch's default); 1 is fastest for small networks beside the envs"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "flashmarl"
    wandb_entity: str | None = None
    capture_video: bool = False
    """record a greedy episode at each evaluation (or with --eval-checkpoint)"""
    save_model: bool = True
    """write last.pt at the end and best.pt at each best evaluation (Ctrl-C always writes last.pt)"""
    save_buffer: bool = True
    """at Ctrl-C, also write the replay buffer to replay.npz, so --resume replays the same data (else it refills)"""
    eval_interval: int = 100_000
    """env steps between greedy evaluations (0: only at the end)"""
    eval_episodes: int = 10
    """episodes per evaluation"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint greedily and exit"""
    resume: str | None = None
    """continue the run in this directory from its last.pt (and replay.npz, the replay buffer at Ctrl-C)"""
    run_dir: str | None = None
    """where to write (default runs/<env>__matd3__<seed>__<time>)"""

    # --- MATD3 (defaults: MADDPG's MPE settings and TD3's three additions, tuned for 10M steps of simple_spread) ---
    buffer_size: int = 100_000
    """replay capacity in transitions (one step of one env, every agent): XuanCe's 100k (the MADDPG paper's 1e6)"""
    batch_size: int = 256
    """transitions per update (XuanCe's 256; MADDPG's 1024 costs ~2x per update)"""
    learning_starts: int = 25_000
    """transitions collected with uniformly random actions before the first update"""
    train_frequency: int = 256
    """env steps (summed over envs) per round of --gradient-steps updates: 1 update per 256 transitions, ~39k in
    10M steps (MADDPG's code: 1 per 100 transitions, XuanCe: 1 per 400); the updates dominate the run time"""
    gradient_steps: int = 1
    """updates per round"""
    gamma: float = 0.95
    """discount (the paper's 0.95 for 25-step MPE episodes)"""
    tau: float = 0.001
    """soft target-network update rate (XuanCe's 0.001; the MADDPG paper's 0.01)"""
    actor_lr: float = 1e-2
    """Adam learning rate of the actors (the MADDPG paper's and XuanCe's 1e-2)"""
    critic_lr: float = 1e-3
    """Adam learning rate of the critics"""
    max_grad_norm: float = 0.5
    """gradient-norm clip of each agent's network (and each twin critic) separately (MADDPG's 0.5; 0: off)"""
    hidden_size: int = 64
    """width of the two hidden layers of every actor and critic (MADDPG's 64)"""
    exploration_noise: float = 0.1
    """std of the Gaussian action noise while training, in units of half the action range (continuous actions)"""
    gumbel_temperature: float = 1.0
    """temperature of the straight-through Gumbel-softmax that carries the actor gradient (discrete actions)"""
    policy_noise: float = 0.2
    """std of the target policy smoothing noise, in units of half the action range (TD3's 0.2; continuous actions)"""
    noise_clip: float = 0.5
    """clip of the target policy smoothing noise, same units (TD3's 0.5)"""
    policy_frequency: int = 2
    """critic updates per (delayed) actor and target-network update (TD3's 2)"""
    actor_reg: float = 1e-3
    """weight of the squared pre-activation (logit / pre-tanh) penalty in the actor loss (the MADDPG code's 1e-3)"""
    critic_state: bool = False
    """critics see the env's global state instead of every agent's observation"""
    share_params: bool = True
    """one actor and one critic per group, fed an agent-id one-hot (as XuanCe); --no-share-params: one per agent,
    as in the MADDPG paper"""
    random_groups: tuple[str, ...] = ()
    """groups frozen to a uniformly random policy, e.g. adversary (every other group learns)"""
    prioritized: bool = False
    """prioritized replay (Schaul et al. 2016) by the TD error, averaged over the learning agents"""
    prioritized_replay_alpha: float = 0.6
    """priority exponent"""
    prioritized_replay_beta: float = 0.4
    """initial importance-sampling exponent, annealed linearly to 1 at --total-timesteps"""
    log_interval: int = 2_000
    """env steps between TensorBoard points of losses and SPS"""


class GroupLinear(nn.Module):
    """n independent linear layers, one batched matmul: (m, B, d_in) -> (m, B, d_out) through the first m <= n."""

    def __init__(self, n, d_in, d_out):
        super().__init__()
        bound = d_in**-0.5  # nn.Linear's default initialization, layer by layer
        self.weight = nn.Parameter(torch.empty(n, d_in, d_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(n, 1, d_out).uniform_(-bound, bound))

    def forward(self, x):
        return torch.baddbmm(self.bias[: len(x)], x, self.weight[: len(x)])


class AgentMLPs(nn.Module):
    """One MLP per agent of a group (or one shared, fed an agent-id one-hot), `copies` times over (twin critics):
    (A, B, d_in) -> (copies, A, B, d_out), one batched matmul per layer for all of them (or the first `copies`)."""

    def __init__(self, n_agents, d_in, d_out, args, copies=1):
        super().__init__()
        self.ids = n_agents if args.share_params and n_agents > 1 else 0
        self.n, self.copies, h = copies * (1 if args.share_params else n_agents), copies, args.hidden_size
        self.net = nn.Sequential(GroupLinear(self.n, d_in + self.ids, h), nn.ReLU(), GroupLinear(self.n, h, h),
                                 nn.ReLU(), GroupLinear(self.n, h, d_out))  # fmt: skip

    def forward(self, x, copies=None):
        A, B, copies = *x.shape[:2], copies or self.copies
        if self.ids:
            x = torch.cat([x, torch.eye(A, device=x.device)[:, None].expand(A, B, A)], -1)
        n = self.n // self.copies * copies
        x = x.expand(copies, *x.shape).reshape(n, -1, x.shape[-1])  # shared: agents join the batch
        return self.net(x).view(copies, A, B, -1)


class Actor(nn.Module):
    """One group's deterministic policies mu_i(o_i) on batch-major observations (B, A, *obs_shape)."""

    def __init__(self, spec, args):
        super().__init__()
        self.spec, self.temperature = spec, args.gumbel_temperature
        self.net = AgentMLPs(spec.n_agents, int(np.prod(spec.obs_shape)), spec.action_dim, args)
        if not spec.discrete:  # tanh squashes into the env's [low, high] (mpe2: [0, 1])
            self.register_buffer("low", torch.as_tensor(spec.action_low))
            self.register_buffer("high", torch.as_tensor(spec.action_high))

    def forward(self, obs):  # -> (B, A, d): pre-tanh outputs, or logits of discrete actions
        return self.net(obs.flatten(2).transpose(0, 1))[0].transpose(0, 1)

    def action(self, raw, avail=None, sample=False, noise=None):
        """Float actions (B, A, d). Discrete: a one-hot argmax over the available actions, or with `sample` a
        straight-through Gumbel-softmax sample; continuous: tanh into [low, high], plus `noise` in units of half the
        range, clipped to it."""
        if self.spec.discrete:
            raw = raw if avail is None else raw.masked_fill(avail == 0, -1e9)
            if sample:
                return F.gumbel_softmax(raw, self.temperature, hard=True)
            return F.one_hot(raw.argmax(-1), raw.shape[-1]).float()
        a = self.low + (torch.tanh(raw) + 1) * (self.high - self.low) / 2
        return a if noise is None else (a + noise * (self.high - self.low) / 2).clamp(self.low, self.high)

    def uniform(self, obs, avail=None):
        """Uniformly random actions (B, A, d), for the warm-up and --random-groups."""
        u = torch.rand(*obs.shape[:2], self.spec.action_dim, device=obs.device)
        if not self.spec.discrete:
            return self.low + u * (self.high - self.low)
        u = u if avail is None else u * avail  # the argmax of uniforms: a uniform choice among available actions
        return F.one_hot(u.argmax(-1), self.spec.action_dim).float()


class Critic(nn.Module):
    """Per-agent centralized twin critics Q_i^1, Q_i^2(x, a_1, ..., a_N): input (A, B, D) -> (copies, B, A)."""

    def __init__(self, spec, d_in, args):
        super().__init__()
        self.net = AgentMLPs(spec.n_agents, d_in, 1, args, copies=2)

    def forward(self, x, copies=2):  # copies=1: Q^1 alone, for the actor loss
        return self.net(x, copies)[..., 0].transpose(1, 2)


def act(actors, obs, device, args, explore=True, uniform=False):
    """Every group's actions as env.step takes them: greedy, with exploration noise, or uniform (warm-up, frozen)."""
    t = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.float32, device=device)  # noqa: E731
    actions = {}
    for g, actor in actors.items():
        o, avail = t(obs.obs[g]), t(obs.avail_actions[g]) if g in obs.avail_actions else None
        if uniform or g in args.random_groups:
            a = actor.uniform(o, avail)
        elif explore:  # Gaussian noise (continuous), a sample of softmax(logits) (discrete)
            raw = actor(o)
            a = actor.action(raw, avail, sample=True, noise=args.exploration_noise * torch.randn_like(raw))
        else:
            a = actor.action(actor(o), avail)
        actions[g] = a.argmax(-1).cpu().numpy() if actor.spec.discrete else a.cpu().numpy()
    return actions


def critic_input(x_obs, actions, n_agents, g=None, own=None):
    """The input of group g's critics, (A_g, B, D): [every observation (or the state), every agent's action].

    With `own` (B, A_g, d), row i carries agent i's policy action own[:, i] in its own slot and the buffer's actions
    elsewhere, so each actor's gradient flows through its own action only (MADDPG's policy gradient)."""
    parts = [x_obs]
    for h, a in actions.items():  # a: (B, A_h, d_h), one-hot for discrete actions
        if h == g and own is not None:
            eye = torch.eye(n_agents, dtype=torch.bool, device=a.device)[:, None, :, None]
            parts.append(torch.where(eye, own[None], a[None]).flatten(2))  # (A_g, B, A_g * d)
        else:
            parts.append(a.flatten(1))
    return torch.cat([p.expand(n_agents, *p.shape[-2:]) for p in parts], -1)


def optimize(loss, optimizer, nets, max_grad_norm, name):
    """One optimizer step on `loss`, refused if it is not finite; each agent's network clipped separately."""
    if not torch.isfinite(loss):  # stop before the weights are poisoned
        raise FloatingPointError(f"the {name} loss became {loss.item()}; lower --{name}-lr or check the rewards")
    optimizer.zero_grad()
    loss.backward()
    for net in nets if max_grad_norm > 0 else ():  # as if every agent had its own optimizer (the MADDPG code)
        grads = [p.grad for p in net.parameters()]  # every parameter stacks the n networks on its first dim
        norms = torch.stack([grad.flatten(1).square().sum(1) for grad in grads]).sum(0).sqrt()  # (n,)
        scale = (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_(grads, [scale.view(-1, *(1,) * (grad.dim() - 1)) for grad in grads])
    optimizer.step()


def soft_update(targets, sources, tau):
    """theta' <- theta' + tau (theta - theta') for every parameter of every network, in one foreach op."""
    with torch.no_grad():
        params = lambda nets: [p for net in nets for p in net.parameters()]  # noqa: E731
        torch._foreach_lerp_(params(targets), params(sources), tau)


def update(b, nets, optimizers, args, learners, num_updates):
    """One MATD3 update from a batch-major batch `b`: the twin critics; every --policy-frequency: actors, targets."""
    actors, critics, actor_targets, critic_targets = nets.values()
    specs = {g: a.spec for g, a in actors.items()}
    sizes = {g: s.n_agents for g, s in specs.items()}
    onehot = lambda a, s: F.one_hot(a, s.action_dim).float() if s.discrete else a  # noqa: E731
    actions = {g: onehot(b[f"actions_{g}"], s) for g, s in specs.items()}
    if args.critic_state:
        x_obs, x_next = b["state"].flatten(1), b["next_state"].flatten(1)
    else:  # every agent's observation, concatenated: (B, sum_g A_g * obs_dim_g)
        x_obs, x_next = (torch.cat([b[f"{k}_{g}"].flatten(1) for g in specs], -1) for k in ("obs", "next_obs"))
    weights = b["weights"][:, None] if "weights" in b else 1.0  # prioritized replay's importance weights

    # TARGETS: y_i = r_i + gamma (1 - terminated_i) min_k Q'^k_i(x', a'_1, ..., a'_N), a'_j = mu'_j(o'_j) + clipped
    # noise (target policy smoothing; discrete actions: a Gumbel-softmax sample); truncation bootstraps
    with torch.no_grad():
        next_actions = {}
        for g, actor in actor_targets.items():
            o, avail = b[f"next_obs_{g}"], b.get(f"next_avail_{g}")
            if g in args.random_groups:  # a frozen group's policy is the uniform one
                next_actions[g] = actor.uniform(o, avail)
                continue
            raw = actor(o)
            noise = (args.policy_noise * torch.randn_like(raw)).clamp(-args.noise_clip, args.noise_clip)
            next_actions[g] = actor.action(raw, avail, sample=True, noise=noise)
        targets = {g: b[f"rewards_{g}"] + args.gamma * (1 - b[f"terminated_{g}"])
                   * critic_targets[g](critic_input(x_next, next_actions, sizes[g])).min(0).values
                   for g in learners}  # fmt: skip

    # UPDATE critics: squared TD errors of both twins of every learning agent (alive at the step), summed
    qf_losses, q_values, td = {}, {}, 0.0
    for g in learners:
        q = critics[g](critic_input(x_obs, actions, sizes[g]))  # (2, B, A)
        err = (q - targets[g]) * b[f"agent_mask_{g}"]
        qf_losses[g], q_values[g] = (weights * err**2).mean(1).sum(0), q[0].detach().mean(0)  # per agent: (A,)
        td = td + err[0].detach().abs().sum(1)  # Q^1's TD error sets the priorities
    qf_loss = torch.cat(list(qf_losses.values())).sum()
    optimize(qf_loss, optimizers["critic"], critics.values(), args.max_grad_norm, "critic")

    per_agent = {"qf_loss": qf_losses, "q_values": q_values}  # key -> g -> (A_g,)
    if num_updates % args.policy_frequency == 0:
        # UPDATE actors (delayed): ascend Q^1_i(x, a_1, ..., mu_i(o_i), ..., a_N) with the critic just updated (a
        # fresh forward after the critic step: no in-place modified tensors in the graph); then the target networks
        actor_losses = {}
        critics.requires_grad_(False)
        for g in learners:
            actor = actors[g]
            raw = actor(b[f"obs_{g}"])
            own = actor.action(raw, b.get(f"avail_{g}"), sample=True)  # tanh, or straight-through Gumbel-softmax
            q = critics[g](critic_input(x_obs, actions, sizes[g], g, own), copies=1)[0]
            actor_losses[g] = -(q * b[f"agent_mask_{g}"]).mean(0) + args.actor_reg * raw.square().mean((0, 2))
        critics.requires_grad_(True)
        actor_loss = torch.cat(list(actor_losses.values())).sum()
        optimize(actor_loss, optimizers["actor"], [actors[g] for g in learners], args.max_grad_norm, "actor")
        soft_update((actor_targets, critic_targets), (actors, critics), args.tau)
        per_agent["actor_loss"] = actor_losses
    losses = {k: torch.cat(list(v.values())).detach().mean() for k, v in per_agent.items()}  # mean over agents
    if len(learners) > 1:
        losses |= {f"{k}/{g}": x.detach().mean() for k, v in per_agent.items() for g, x in v.items()}
    return losses, td / sum(sizes[g] for g in learners)


def env_kwargs(args):
    try:
        kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as e:
        raise ValueError(f"--env-kwargs is not valid JSON ({e}); use e.g. '{{\"N\": 5}}'") from None
    flags = dict(continuous_actions=args.continuous_actions or None, max_cycles=args.max_cycles, map_size=args.map_size)
    return kwargs | {k: v for k, v in flags.items() if v is not None}


def make_env(args, num_envs, seed, backend, vector):
    try:
        return envs.make(args.env_id, num_envs, seed, vector=vector, backend=backend, **env_kwargs(args))
    except envs.EnvArgumentError as e:  # the usual case: an env without a continuous_actions argument
        if not (args.continuous_actions and "continuous_actions" in str(e)):
            raise
        raise ValueError(f"{args.env_id} has no continuous actions ({e}); use --no-continuous-actions") from None


def evaluate(actors, args, device, seed, video_path=None):
    """Greedy episodes on the standard PettingZoo env, one per env (so short episodes are not favoured)."""
    n = args.eval_episodes
    env = make_env(args, n, seed, "pettingzoo", "sync")
    obs, returns, group_returns = env.reset(), [None] * n, {}
    greedy = lambda o: act(actors, o, device, args, explore=False)  # noqa: E731
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # --random-groups draw from their own stream
        torch.manual_seed(seed)
        while any(r is None for r in returns):
            step = env.step(greedy(obs))
            for ep in step.episodes:
                if returns[ep.env_index] is None:
                    returns[ep.env_index] = ep.episode_return
                    for g, r in ep.group_returns.items():
                        group_returns.setdefault(g, []).append(r)
            obs = step.next
        env.close()
        if video_path is not None:
            envs.record_episode(args.env_id, greedy, video_path, seed=seed, **env_kwargs(args))
    return np.array(returns), {g: float(np.mean(r)) for g, r in group_returns.items()}


def env_signature(env):
    """What a checkpoint must match: groups, agent counts, observation, action and state spaces."""
    sig = {g: [s.n_agents, list(s.obs_shape), s.discrete, s.action_dim] for g, s in env.groups.items()}
    return sig | {"state_shape": list(env.state_shape)}


def save_checkpoint(path, nets, optimizers, args, signature, global_step, num_updates, rng, best_eval):
    """Everything --resume needs but the replay buffer, in types that torch.load(weights_only=True) accepts."""
    ckpt = dict(algo=ALGO, env_id=args.env_id, signature=signature, args=json.loads(json.dumps(asdict(args))),
                nets={k: m.state_dict() for k, m in nets.items()},
                optimizers={k: o.state_dict() for k, o in optimizers.items()},
                global_step=global_step, best_eval=float(best_eval), num_updates=num_updates,
                rng={"torch": torch.get_rng_state(), "numpy": rng.bit_generator.state})  # fmt: skip
    torch.save(ckpt, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)  # never leave a half-written checkpoint behind


def load_checkpoint(path, args, signature, nets, names):
    """Load the networks `names` of `nets` from a checkpoint of this algorithm on the same spaces."""
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a damaged file
        raise ValueError(
            f"checkpoint {path} is unreadable (corrupt or not a torch file): {e}".splitlines()[0]
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("algo") != ALGO:
        raise ValueError(f"checkpoint {path} is not a {ALGO} checkpoint")
    if ckpt["env_id"] != args.env_id or ckpt["signature"] != signature:
        raise ValueError(
            f"checkpoint {path} was trained on {ckpt['env_id']} with spaces {ckpt['signature']}, which do not "
            f"match {args.env_id} with {signature}: pass the same --env-id and env flags"
        )
    try:
        for k in names:
            nets[k].load_state_dict(ckpt["nets"][k])
    except (RuntimeError, KeyError) as e:
        raise ValueError(
            f"checkpoint {path} holds other networks than these flags build (--hidden-size, --share-params, "
            f"--critic-state, --random-groups): {' '.join(str(e).split())[:300]}"
        ) from None
    return ckpt


def replay_fields(groups, state_shape, args):
    """One joint transition of every agent, declared once: name -> (per-env shape, dtype)."""
    fields = {}
    for g, s in groups.items():
        A, obs = s.n_agents, ((s.n_agents, *s.obs_shape), np.float32)
        action = ((A,), np.int64) if s.discrete else ((A, s.action_dim), np.float32)
        fields |= {f"obs_{g}": obs, f"next_obs_{g}": obs, f"actions_{g}": action, f"rewards_{g}": ((A,), np.float32),
                   f"terminated_{g}": ((A,), np.bool_), f"agent_mask_{g}": ((A,), np.bool_)}  # fmt: skip
        if s.has_action_mask:
            fields |= {f"{k}_{g}": ((A, s.action_dim), np.bool_) for k in ("avail", "next_avail")}
    if args.critic_state:
        fields |= {"state": (state_shape, np.float32), "next_state": (state_shape, np.float32)}
    return fields


def transition(obs, actions, step, args):
    """One step of every env as the fields above: the next observation is step.final's (pre-reset where an episode
    ended), and rewards/terminated are per agent, truncation being no field: only termination stops the bootstrap."""
    final = step.final
    sources = dict(obs=obs.obs, next_obs=final.obs, actions=actions, rewards=step.rewards, terminated=step.terminated,
                   agent_mask=obs.agent_mask, avail=obs.avail_actions, next_avail=final.avail_actions)  # fmt: skip
    out = {f"{k}_{g}": v[g] for k, v in sources.items() for g in v}
    return out | ({"state": obs.state, "next_state": final.state} if args.critic_state else {})


def main(args):
    if args.cuda and not torch.cuda.is_available():
        raise ValueError("--cuda was given but no CUDA device is available: drop --cuda to train on the CPU")
    device = torch.device("cuda" if args.cuda else "cpu")
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)

    # seeding, envs, networks
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    rng = np.random.default_rng(args.seed)
    env = make_env(args, args.num_envs, args.seed, args.backend, args.vector)
    signature = env_signature(env)
    if unknown := [g for g in args.random_groups if g not in env.groups]:
        raise ValueError(f"--random-groups {unknown}: {args.env_id} has the groups {list(env.groups)}")
    learners = [g for g in env.groups if g not in args.random_groups]
    if not learners:
        raise ValueError(f"--random-groups freezes every group of {args.env_id}: nothing would learn")
    obs_dim = int(np.prod(env.state_shape)) if args.critic_state else 0
    obs_dim = obs_dim or sum(s.n_agents * int(np.prod(s.obs_shape)) for s in env.groups.values())
    critic_dim = obs_dim + sum(s.n_agents * s.action_dim for s in env.groups.values())
    actors = nn.ModuleDict({g: Actor(spec, args) for g, spec in env.groups.items()}).to(device)
    critics = nn.ModuleDict({g: Critic(env.groups[g], critic_dim, args) for g in learners}).to(device)
    actor_targets, critic_targets = copy.deepcopy(actors), copy.deepcopy(critics)
    nets = dict(actors=actors, critics=critics, actor_targets=actor_targets, critic_targets=critic_targets)

    if args.eval_checkpoint:
        load_checkpoint(args.eval_checkpoint, args, signature, nets, ["actors"])
        video = os.path.join(os.path.dirname(args.eval_checkpoint), "eval.mp4") if args.capture_video else None
        returns, per_group = evaluate(actors, args, device, args.seed + 10_000, video)
        print(f"{args.env_id} {ALGO} {args.eval_checkpoint}: episodic return {returns.mean():.2f} ± "
              f"{returns.std():.2f} over {len(returns)} greedy episodes; per group {per_group}"
              + (f"; video {video}" if video else ""))  # fmt: skip
        return

    # fused Adam: one kernel for all parameters (on the CPU since torch 2.4), ~3x faster than the per-tensor loop
    fused = device.type == "cuda" or tuple(map(int, torch.__version__.split(".")[:2])) >= (2, 4)
    optimizers = dict(actor=torch.optim.Adam([p for g in learners for p in actors[g].parameters()], lr=args.actor_lr,
                                             fused=fused),
                      critic=torch.optim.Adam(critics.parameters(), lr=args.critic_lr, fused=fused))  # fmt: skip
    if args.batch_size > args.buffer_size:
        raise ValueError(f"--batch-size {args.batch_size} exceeds --buffer-size {args.buffer_size}")
    global_step, num_updates = 0, 0
    if args.resume:  # same weights, targets, optimizer moments, counters and RNG; the replay buffer below
        run_dir = args.resume
        ckpt = load_checkpoint(os.path.join(run_dir, "last.pt"), args, signature, nets, nets)
        for k, opt in optimizers.items():
            opt.load_state_dict(ckpt["optimizers"][k])
        global_step, num_updates = ckpt["global_step"], ckpt["num_updates"]
        torch.set_rng_state(ckpt["rng"]["torch"])
        rng.bit_generator.state = ckpt["rng"]["numpy"]
    else:
        run_dir = args.run_dir or f"runs/{args.env_id}__{ALGO}__{args.seed}__{int(time.time())}"
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(asdict(args) | {"env_class": type(env).__name__}, f, indent=2)
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=asdict(args),
                   name=os.path.basename(run_dir), sync_tensorboard=True)  # fmt: skip
    writer = SummaryWriter(run_dir)
    fields = replay_fields(env.groups, env.state_shape, args)
    per = dict(alpha=args.prioritized_replay_alpha) if args.prioritized else {}
    rb = (PrioritizedReplayBuffer if args.prioritized else ReplayBuffer)(args.buffer_size, args.num_envs, fields, **per)
    replay_file = os.path.join(run_dir, "replay.npz")
    if args.resume and os.path.exists(replay_file):
        rb.load(replay_file)
        print(f"resumed with the {len(rb)} transitions of {replay_file}")
    elif args.resume:
        print(f"{replay_file} does not exist: the replay buffer refills for {args.learning_starts} steps")
    learning_starts = max(min(args.learning_starts, rb.capacity), args.batch_size)

    def checkpoint(name, step, best):
        if args.save_model or name == "last.pt":
            path = os.path.join(run_dir, name)
            save_checkpoint(path, nets, optimizers, args, signature, step, num_updates, rng, best)

    def run_eval(step, best):
        """Greedy evaluation on the standard env; keeps best.pt and an optional video."""
        video = os.path.join(run_dir, "videos", f"step_{step}.mp4") if args.capture_video else None
        returns, per_group = evaluate(actors, args, device, args.seed + 10_000, video)
        writer.add_scalar("eval/episodic_return", returns.mean(), step)
        for g, r in per_group.items():
            writer.add_scalar(f"eval/episodic_return/{g}", r, step)
        if returns.mean() > best:
            checkpoint("best.pt", step, returns.mean())
        return float(returns.mean()), max(best, float(returns.mean()))

    next_eval = (global_step // args.eval_interval + 1) * args.eval_interval if args.eval_interval else None
    next_log = global_step + args.log_interval
    best_eval = ckpt.get("best_eval", -np.inf) if args.resume else -np.inf  # a resumed run keeps best.pt
    last_eval, last_eval_step, losses = float("nan"), -1, {}
    obs = env.reset()
    start_time, start_step = time.time(), global_step
    bar = tqdm(total=args.total_timesteps, initial=global_step, unit="step", dynamic_ncols=True)
    try:
        while global_step < args.total_timesteps:
            # ACT: uniformly random until --learning-starts, then mu(o) plus exploration noise
            with torch.no_grad():
                actions = act(actors, obs, device, args, uniform=global_step < args.learning_starts)
            # STEP
            step = env.step(actions)
            global_step += args.num_envs
            # STORE: the next observation is step.final (the pre-reset one where an episode ended)
            rb.add(**transition(obs, actions, step, args))
            if eps := step.episodes:  # one point per step: the mean over the episodes that just finished
                writer.add_scalar("charts/episodic_return", np.mean([e.episode_return for e in eps]), global_step)
                writer.add_scalar("charts/episodic_length", np.mean([e.length for e in eps]), global_step)
                for g in eps[0].group_returns:
                    r = np.mean([e.group_returns[g] for e in eps])
                    writer.add_scalar(f"charts/episodic_return/{g}", r, global_step)
            obs = step.next

            # UPDATE: --gradient-steps updates per --train-frequency env steps
            rounds = global_step // args.train_frequency - (global_step - args.num_envs) // args.train_frequency
            if len(rb) >= learning_starts:
                beta0 = args.prioritized_replay_beta  # annealed linearly to 1
                beta = beta0 + (1 - beta0) * min(1, global_step / args.total_timesteps)
                for _ in range(rounds * args.gradient_steps):
                    sample = rb.sample(args.batch_size, rng, **({"beta": beta} if args.prioritized else {}))
                    new_losses, td = update(to_torch(sample, device), nets, optimizers, args, learners, num_updates)
                    losses, num_updates = losses | new_losses, num_updates + 1
                    if args.prioritized:
                        rb.update_priorities(sample["indices"], td.cpu().numpy())

            # LOG
            if global_step >= next_log or global_step >= args.total_timesteps:
                next_log += args.log_interval
                sps = int((global_step - start_step) / (time.time() - start_time))
                writer.add_scalar("charts/SPS", sps, global_step)
                for k, v in losses.items():  # the latest update's: the mean over agents, then per group
                    writer.add_scalar(f"losses/{k}", v.item(), global_step)
                if losses and args.prioritized:
                    writer.add_scalar("charts/beta", beta, global_step)
                bar.update(global_step - bar.n)
                bar.set_postfix(SPS=sps, eval=f"{last_eval:.2f}")

            # EVAL
            if next_eval is not None and global_step >= next_eval:
                next_eval += args.eval_interval
                last_eval, best_eval = run_eval(global_step, best_eval)
                last_eval_step = global_step
    except (KeyboardInterrupt, FloatingPointError) as e:
        bar.close()
        checkpoint("last.pt", global_step, best_eval)
        if args.save_buffer:
            rb.save(replay_file)
        writer.close()
        if isinstance(e, FloatingPointError):
            raise FloatingPointError(f"{e}; saved {run_dir}/last.pt (no step was taken on that loss)") from None
        print(f"interrupted at step {global_step}: saved {run_dir}/last.pt; continue with --resume {run_dir}")
        sys.exit(130)
    bar.close()

    if last_eval_step != global_step:
        last_eval, best_eval = run_eval(global_step, best_eval)
    checkpoint("last.pt", global_step, best_eval)
    writer.close()
    env.close()
    open(os.path.join(run_dir, "DONE"), "w").close()
    print(f"done: {global_step} steps, final greedy return {last_eval:.2f} (best {best_eval:.2f}); run dir {run_dir}")


if __name__ == "__main__":
    # Ctrl-C, kill -INT and SIGTERM (kill, a cluster's preemption) all save last.pt, also in a background job,
    # which starts with SIGINT ignored (Python then installs no KeyboardInterrupt handler of its own)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args = tyro.cli(Args)
    try:
        main(args)
    except (ValueError, ImportError, BufferInputError, FloatingPointError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
