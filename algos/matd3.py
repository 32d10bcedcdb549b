"""MATD3 (Ackermann et al. 2019, arXiv:1910.01465); results: results/simple_spread_v3/matd3.json"""

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from buffers import PrioritizedReplayBuffer, ReplayBuffer, float_tensor, joint_fields, joint_transition, to_torch
from runtime import (
    GroupLinear,
    MakePolicy,
    MultiAgentArgs,
    Run,
    adam,
    check_action_flags,
    check_args,
    checkpoint_args,
    cli,
    crossings,
    linear_schedule,
    make_env,
    optimize,
    setup,
    soft_update,
    sub_state,
)

ALGO = "matd3"


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    continuous_actions: bool = True
    """continuous (Box) MPE actions, as in published MPE baselines; --no-continuous-actions: discrete, Gumbel-softmax"""
    save_buffer: bool = True
    """at Ctrl-C, also write the replay buffer to replay.npz, so --resume replays the same data (else it refills)"""

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
    prioritized: bool = False
    """prioritized replay (Schaul et al. 2016) by the TD error, averaged over the learning agents"""
    prioritized_replay_alpha: float = 0.6
    """priority exponent"""
    prioritized_replay_beta: float = 0.4
    """initial importance-sampling exponent, annealed linearly to 1 at --total-timesteps"""
    log_interval: int = 2_000
    """env steps between TensorBoard points of losses and SPS"""


def layer_init(layer):  # nn.Linear's default initialization, layer by layer: weights and biases U(+-1/sqrt(d_in))
    bound = layer.weight.shape[1] ** -0.5
    nn.init.uniform_(layer.weight, -bound, bound)
    nn.init.uniform_(layer.bias, -bound, bound)
    return layer


class AgentMLPs(nn.Module):
    """One MLP per agent of a group (or one shared, fed an agent-id one-hot), `copies` times over (twin critics):
    (A, B, d_in) -> (copies, A, B, d_out), one batched matmul per layer for all of them (or the first `copies`)."""

    def __init__(self, n_agents, d_in, d_out, args, copies=1):
        super().__init__()
        self.ids = n_agents if args.share_params and n_agents > 1 else 0
        self.n, self.copies, h = copies * (1 if args.share_params else n_agents), copies, args.hidden_size
        self.net = nn.Sequential(
            layer_init(GroupLinear(self.n, d_in + self.ids, h)),
            nn.ReLU(),
            layer_init(GroupLinear(self.n, h, h)),
            nn.ReLU(),
            layer_init(GroupLinear(self.n, h, d_out)),
        )

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
    actions = {}
    for g, actor in actors.items():
        o = float_tensor(obs.obs[g], device)
        avail = float_tensor(obs.avail_actions[g], device) if g in obs.avail_actions else None
        if uniform:
            a = actor.uniform(o, avail)
        elif explore:  # Gaussian noise (continuous), a sample of softmax(logits) (discrete)
            raw = actor(o)
            a = actor.action(raw, avail, sample=True, noise=args.exploration_noise * torch.randn_like(raw))
        else:
            a = actor.action(actor(o), avail)
        actions[g] = a.argmax(-1).cpu().numpy() if actor.spec.discrete else a.cpu().numpy()
    return actions


def acting(actors, args, device, greedy=True) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: mu(o), or with exploration noise if not greedy (the
    evaluations, and a checkpoint playing a group: `actor`)."""
    return lambda num_envs, rng: lambda obs, done: act(actors, obs, device, args, explore=not greedy)


def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:
    """Group `group` of a checkpoint as an actor: --opponent, --self-play, results/tournament.py (runtime.opponents)."""
    args = checkpoint_args(Args, ckpt["args"])
    net = Actor(spec, args).to(device)
    net.load_state_dict(sub_state(ckpt["nets"]["actors"], f"{group}."))
    return acting(nn.ModuleDict({group: net}), args, device, greedy)


NETWORK_FLAGS = ("hidden_size", "share_params", "critic_state", "random_groups")  # what the weights depend on


def main(args):
    check_args(args)
    device, rng = setup(args)
    env = make_env(args, args.num_envs, args.seed)
    learners = list(env.groups)  # the learning groups: make_env acts for the frozen ones
    check_action_flags(
        args,
        env,
        continuous_only=("exploration_noise", "policy_noise", "noise_clip"),
        discrete_only=("gumbel_temperature",),
    )
    obs_dim = int(np.prod(env.state_shape)) if args.critic_state else 0
    obs_dim = obs_dim or sum(s.n_agents * int(np.prod(s.obs_shape)) for s in env.groups.values())
    critic_dim = obs_dim + sum(s.n_agents * s.action_dim for s in env.groups.values())
    actors = nn.ModuleDict({g: Actor(spec, args) for g, spec in env.groups.items()}).to(device)
    critics = nn.ModuleDict({g: Critic(env.groups[g], critic_dim, args) for g in learners}).to(device)
    actor_targets, critic_targets = copy.deepcopy(actors), copy.deepcopy(critics)
    nets = dict(actors=actors, critics=critics, actor_targets=actor_targets, critic_targets=critic_targets)
    make_greedy = acting(actors, args, device)  # evaluation: mu(o), no noise

    optimizers = dict(
        actor=adam([p for g in learners for p in actors[g].parameters()], args.actor_lr),
        critic=adam(critics.parameters(), args.critic_lr),
    )  # fused Adam: runtime/optim.py
    fields = joint_fields(env.groups, env.state_shape if args.critic_state else None)
    per = dict(alpha=args.prioritized_replay_alpha) if args.prioritized else {}
    rb = (PrioritizedReplayBuffer if args.prioritized else ReplayBuffer)(args.buffer_size, args.num_envs, fields, **per)
    run = Run(args, ALGO, env, nets, optimizers, rng, make_greedy, network_flags=NETWORK_FLAGS, replay=rb)
    writer, global_step, num_updates = run.writer, run.global_step, run.counters.get("num_updates", 0)
    learning_starts = max(min(args.learning_starts, rb.capacity), args.batch_size)
    obs, losses = run.begin(env.reset(), losses={})  # what the loop carries (--resume: from last.pt, with the env)
    with run:
        while global_step < args.total_timesteps:
            # ACT: uniformly random until --learning-starts, then mu(o) plus exploration noise
            with torch.no_grad():
                actions = act(actors, obs, device, args, uniform=global_step < args.learning_starts)
            # STEP
            step = env.step(actions)
            global_step += args.num_envs
            # STORE: the next observation is step.final (the pre-reset one where an episode ended)
            rb.add(**joint_transition(obs, actions, step, env.groups, args.critic_state))
            run.log_episodes(step.episodes, global_step)
            obs = step.next

            # UPDATE: --gradient-steps updates per --train-frequency env steps
            rounds = crossings(global_step, args.num_envs, args.train_frequency)
            if len(rb) >= learning_starts:
                beta = linear_schedule(
                    args.prioritized_replay_beta, 1.0, args.total_timesteps, global_step
                )  # to 1 (--prioritized)
                for _ in range(rounds * args.gradient_steps):
                    sample = rb.sample(args.batch_size, rng, **({"beta": beta} if args.prioritized else {}))
                    new_losses, td = update(to_torch(sample, device), nets, optimizers, args, learners, num_updates)
                    losses, num_updates = losses | new_losses, num_updates + 1
                    if args.prioritized:
                        rb.update_priorities(sample["indices"], td.cpu().numpy())

            # LOG
            if crossings(global_step, args.num_envs, args.log_interval) or global_step >= args.total_timesteps:
                writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
                for k, v in losses.items():  # the latest update's: the mean over agents, then per group
                    writer.add_scalar(f"losses/{k}", v.item(), global_step)
                if losses and args.prioritized:
                    writer.add_scalar("charts/beta", beta, global_step)
            run.step(global_step, loop=dict(losses=losses), num_updates=num_updates)  # EVAL, checkpoints, Ctrl-C
    run.finish()
    env.close()


# --- what the loop calls: the MATD3 update ---


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


def update(b, nets, optimizers, args, learners, num_updates):
    """One MATD3 update from a batch-major batch `b`: the twin critics; every --policy-frequency: actors, targets."""
    actors, critics = nets["actors"], nets["critics"]
    actor_targets, critic_targets = nets["actor_targets"], nets["critic_targets"]
    specs = {g: actors[g].spec for g in learners}
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
            raw = actor(o)
            noise = (args.policy_noise * torch.randn_like(raw)).clamp(-args.noise_clip, args.noise_clip)
            next_actions[g] = actor.action(raw, avail, sample=True, noise=noise)
        targets = {
            g: b[f"rewards_{g}"]
            + args.gamma
            * (1 - b[f"terminated_{g}"])
            * critic_targets[g](critic_input(x_next, next_actions, sizes[g])).min(0).values
            for g in learners
        }

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


if __name__ == "__main__":
    cli(Args, main)
