"""QTRAN-base, and QTRAN-alt with --variant alt (Son et al. 2019, arXiv:1905.05408)"""

import copy
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from buffers import EpisodeReplayBuffer, agent_views, float_tensor, team_fields, team_step, to_torch
from runtime import (
    MakePolicy,
    MultiAgentArgs,
    Run,
    RunningNorm,
    check_args,
    check_discrete,
    check_finite,
    checkpoint_args,
    cli,
    crossings,
    episode_length,
    linear_schedule,
    make_env,
    reset_finished,
    setup,
    soft_update,
    standardised_rewards,
    sub_state,
)

ALGO = "qtran"
CONTINUOUS = "mappo.py, ippo.py, maddpg.py, matd3.py or iddpg.py"  # the scripts for continuous actions


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    num_envs: int = 128
    """parallel training envs"""
    save_buffer: bool = True
    """at Ctrl-C, also write the replay buffer to replay.npz, so --resume replays the same data (else it refills)"""

    # --- QTRAN (the learning groups form one team; its reward is the mean of its agents' rewards) ---
    variant: Literal["base", "alt"] = "base"
    """base: one Q_jt(s, u) and L_nopt at the taken joint action; alt: Q_jt(s, ., u_-i) for every agent i's actions
    (counterfactual joint networks) and L_nopt-min, the paper's stronger condition (Son et al. 2019, Sec. 3.3)"""
    learning_rate: float = 1e-3
    """Adam learning rate"""
    buffer_size: int = 5_000
    """replay capacity in episodes"""
    max_episode_len: int | None = None
    """longest storable episode (default: the env's time limit)"""
    batch_size: int = 32
    """episodes per gradient step"""
    gamma: float = 0.95
    """discount (0.95 as the value-decomposition scripts use on 25-step MPE episodes)"""
    standardise_rewards: bool = False
    """replay the team rewards as (r - mean) / std of every stored reward replayed so far (EPyMARL's
    standardise_rewards); off by default (unmeasured here: results/Foraging-8x8-2p-2f-coop/reward_scale.md)"""
    tau: float = 1.0
    """target update rate: 1 copies the networks (hard update), < 1 is a Polyak (soft) update"""
    target_network_frequency: int = 20_000
    """env steps between target-network updates (100 gradient steps at the defaults)"""
    start_e: float = 1.0
    """epsilon at the start of exploration"""
    end_e: float = 0.05
    """epsilon at the end of exploration"""
    exploration_fraction: float = 0.05
    """fraction of --total-timesteps over which epsilon decays linearly from --start-e to --end-e"""
    learning_starts: int = 10_000
    """env steps of experience collected before learning starts"""
    train_frequency: int = 200
    """env steps per gradient step (summed over envs)"""
    hidden_size: int = 64
    """width of the agents' encoder and GRU"""
    mixing_embed_dim: int = 64
    """width of the joint action-value and state-value networks (pymarl's qtran_base: 64)"""
    opt_loss: float = 1.0
    """weight of L_opt, which ties the sum of the agents' greedy utilities to Q_jt - V at the greedy joint action"""
    nopt_loss: float = 0.1
    """weight of L_nopt (alt: L_nopt-min), which keeps the sum of the utilities at or above Q_jt - V elsewhere"""
    share_params: bool = True
    """one agent network per group with an agent-id one-hot (--no-share-params: one network per agent)"""
    max_grad_norm: float = 10.0
    """global gradient-norm clip"""
    log_interval: int = 5_000
    """env steps between TensorBoard points of the losses, epsilon and speed"""


class RecurrentQ(nn.Module):
    """Linear-ReLU encoder, a GRU over time, a linear Q head (the paper's DRQN agent)."""

    def __init__(self, d_in, n_actions, hidden_size):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, hidden_size), nn.ReLU())
        self.gru = nn.GRU(hidden_size, hidden_size)
        self.head = nn.Linear(hidden_size, n_actions)

    def forward(self, x, h=None):  # x (T, B, d_in), h (1, B, H) -> Q (T, B, n_actions), h, GRU outputs (T, B, H)
        out, h = self.gru(self.encoder(x), h)
        return self.head(out), h, out


class GroupQ(nn.Module):
    """One group's utilities Q_a(tau_a, .): one RecurrentQ shared (with an agent-id one-hot), or one per agent."""

    def __init__(self, spec, args):
        super().__init__()
        self.ids = spec.n_agents if args.share_params and spec.n_agents > 1 else 0
        d_in, n = int(np.prod(spec.obs_shape)) + self.ids, 1 if args.share_params else spec.n_agents
        self.nets = nn.ModuleList(RecurrentQ(d_in, spec.action_dim, args.hidden_size) for _ in range(n))

    def forward(self, obs, h=None):  # obs (T, B, A, *obs_shape), h (1, B, A, H) or None -> Q (T, B, A, n), h, features
        T, B, A = obs.shape[:3]
        x = obs.flatten(3)
        if self.ids:
            x = torch.cat([x, torch.eye(A, device=x.device).expand(T, B, A, A)], -1)
        if len(self.nets) == 1:  # every agent of the group in one batch
            q, h, out = self.nets[0](x.reshape(T, B * A, -1), None if h is None else h.reshape(1, B * A, -1))
            return q.view(T, B, A, -1), h.view(1, B, A, -1), out.view(T, B, A, -1)
        outs = [net(x[:, :, i], None if h is None else h[:, :, i].contiguous()) for i, net in enumerate(self.nets)]
        return tuple(torch.stack(parts, 2) for parts in zip(*outs, strict=True))


class JointQ(nn.Module):
    """QTRAN-base's Q_jt(s, u) = Q([s, sum_a e(h_a, u_a)]) over the agents' GRU features h_a and one-hot actions u_a
    (the paper's architecture), and V_jt(s); the transformed Q' = sum_a Q_a is the agents' utilities' sum."""

    def __init__(self, n_actions, state_dim, args):
        super().__init__()
        d, e = args.hidden_size + n_actions, args.mixing_embed_dim
        self.encode = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.q = nn.Sequential(nn.Linear(state_dim + d, e), nn.ReLU(), nn.Linear(e, e), nn.ReLU(), nn.Linear(e, 1))
        self.v = nn.Sequential(nn.Linear(state_dim, e), nn.ReLU(), nn.Linear(e, e), nn.ReLU(), nn.Linear(e, 1))

    def forward(self, features, onehot, alive, state):  # (T, B, N, H), (T, B, N, n), (T, B, N), (T, B, S) -> Q_jt, V
        agents = (self.encode(torch.cat([features, onehot], -1)) * alive[..., None]).sum(-2)
        return self.q(torch.cat([state, agents], -1)).squeeze(-1), self.v(state).squeeze(-1)


class CounterfactualQ(JointQ):
    """QTRAN-alt's counterfactual joint networks: for every agent i at once, Q_jt(s, ., u_-i), one value per action of
    agent i, from [s, h_i, sum_{j != i} e(h_j, u_j)] (its own features without its action); and V_jt(s) as base's."""

    def __init__(self, n_actions, state_dim, args):
        super().__init__(n_actions, state_dim, args)
        d, e = args.hidden_size + n_actions, args.mixing_embed_dim
        self.q = nn.Sequential(
            nn.Linear(state_dim + args.hidden_size + d, e),
            nn.ReLU(),
            nn.Linear(e, e),
            nn.ReLU(),
            nn.Linear(e, n_actions),
        )

    def forward(self, features, onehot, alive, state):  # -> Q_jt(s, ., u_-i) (T, B, N, n), V (T, B)
        each = self.encode(torch.cat([features, onehot], -1)) * alive[..., None]  # (T, B, N, d)
        others = each.sum(-2, keepdim=True) - each  # sum over j != i
        x = torch.cat([state[..., None, :].expand(*features.shape[:-1], -1), features, others], -1)
        return self.q(x), self.v(state).squeeze(-1)


class QTRAN(nn.Module):
    """The team: one GroupQ per learning group, and the joint networks over all their agents (one-hot actions padded
    to the largest group's action count)."""

    def __init__(self, specs, state_dim, args):
        super().__init__()
        self.agents = nn.ModuleDict({g: GroupQ(spec, args) for g, spec in specs.items()})
        joint = CounterfactualQ if args.variant == "alt" else JointQ
        self.joint = joint(max(spec.action_dim for spec in specs.values()), state_dim, args)
        if args.standardise_rewards:  # the running statistics of the replayed team rewards, checkpointed
            self.reward_norm = RunningNorm()


@torch.no_grad()
def act(agents, groups, obs, hidden, epsilon, rng, device):
    """Epsilon-greedy actions of every group over its available actions; `hidden` (group -> GRU state) advances."""
    actions = {}
    for g, spec in groups.items():
        avail = obs.avail_actions.get(g)  # (E, A, n) or None
        shape = (*obs.agent_mask[g].shape, spec.action_dim)
        uniform = np.argmax(rng.random(shape) * (1 if avail is None else avail), -1)  # a random available action
        q, hidden[g], _ = agents[g](float_tensor(obs.obs[g], device)[None], hidden[g])
        q = q[0] if avail is None else q[0].masked_fill(~torch.as_tensor(avail, device=device), -torch.inf)
        actions[g] = np.where(rng.random(shape[:2]) < epsilon, uniform, q.argmax(-1).cpu().numpy())
    return actions


def acting(agents, specs, args, device, epsilon) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: epsilon-greedy, each episode from a zero GRU state (the
    evaluations, and a checkpoint playing a group: `actor`)."""

    def make(num_envs, rng):
        hidden = {
            g: torch.zeros(1, num_envs, spec.n_agents, args.hidden_size, device=device) for g, spec in specs.items()
        }

        def act_fn(obs, done):
            nonlocal hidden
            hidden = reset_finished(hidden, done, env_dim=1)  # nn.GRU's states (1, E, A, H)
            return act(agents, specs, obs, hidden, epsilon, rng, device)

        return act_fn

    return make


def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:
    """Group `group` of a checkpoint as an actor (epsilon 0, or --end-e if not greedy): --opponent, --self-play,
    results/tournament.py (runtime.opponents)."""
    args = checkpoint_args(Args, ckpt["args"])
    agents = GroupQ(spec, args).to(device)
    agents.load_state_dict(sub_state(ckpt["nets"]["qtran"], f"agents.{group}."))
    return acting({group: agents}, {group: spec}, args, device, 0.0 if greedy else args.end_e)


NETWORK_FLAGS = (
    "hidden_size",
    "share_params",
    "mixing_embed_dim",
    "variant",
    "standardise_rewards",
)  # what the weights (and the reward statistics) depend on


def main(args):
    check_args(args, (min(args.opt_loss, args.nopt_loss) >= 0, "--opt-loss and --nopt-loss must be >= 0"))
    device, rng = setup(args)
    env = make_env(args, args.num_envs, args.seed)
    check_discrete(args, env, ALGO, CONTINUOUS)
    learners = list(env.groups)  # the learning groups: make_env acts for the frozen ones
    specs = {g: env.groups[g] for g in learners}
    state_dim = int(np.prod(env.state_shape))
    qtran = QTRAN(specs, state_dim, args).to(device)
    target = copy.deepcopy(qtran)
    optimizer = torch.optim.Adam(qtran.parameters(), lr=args.learning_rate)

    make_greedy = acting(qtran.agents, specs, args, device, epsilon=0.0)  # evaluation: greedy
    max_len = episode_length(args, env.max_steps)
    rb = EpisodeReplayBuffer(args.buffer_size, max_len, args.num_envs, team_fields(specs, env.state_shape))
    nets = {"qtran": qtran, "target": target}
    run = Run(args, ALGO, env, nets, {"qtran": optimizer}, rng, make_greedy, network_flags=NETWORK_FLAGS, replay=rb)
    writer, global_step = run.writer, run.global_step
    train_start = global_step + (0 if run.replay_restored else args.learning_starts)  # else the buffer refills
    hidden = {
        g: torch.zeros(1, args.num_envs, spec.n_agents, args.hidden_size, device=device) for g, spec in specs.items()
    }
    obs, hidden, losses = run.begin(env.reset(), hidden=hidden, losses={})  # --resume: from last.pt, with the env
    with run:
        while global_step < args.total_timesteps:
            # ACT: epsilon-greedy on each agent's own utility, from its GRU state
            epsilon = linear_schedule(
                args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
            )
            actions = act(qtran.agents, specs, obs, hidden, epsilon, rng, device)
            # STEP
            step = env.step(actions)
            global_step += args.num_envs
            # STORE: the team's step into each env's running episode; finished episodes close with their final
            # observation (a truncated episode bootstraps from it)
            rb.add(**team_step(obs, actions, step, specs, state=True))
            if (done := np.flatnonzero(step.done)).size:
                final = step.final
                rb.finish(done, **agent_views(final, specs, state=True, envs=done))
                hidden = reset_finished(hidden, step.done, env_dim=1)  # the next episode starts from a zero state
            run.log_episodes(step.episodes, global_step)
            obs = step.next

            # TARGETS and UPDATE: one gradient step per --train-frequency env steps
            if global_step > train_start and len(rb) >= args.batch_size:
                for _ in range(crossings(global_step, args.num_envs, args.train_frequency)):
                    losses = update(qtran, target, optimizer, rb, args, device, rng)
                if crossings(global_step, args.num_envs, args.target_network_frequency):
                    soft_update(target, qtran, args.tau)

            # LOG
            if crossings(global_step, args.num_envs, args.log_interval):
                for k, v in losses.items():
                    writer.add_scalar(f"losses/{k}", v, global_step)
                writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
                writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                writer.add_scalar("charts/epsilon", epsilon, global_step)
            run.step(global_step, loop=dict(hidden=hidden, losses=losses))  # EVAL, checkpoints, and Ctrl-C
    run.finish()
    env.close()


# --- what the loop calls: the QTRAN update ---


def group_outputs(agents, mb, hidden=None):
    """Every learning group's utilities, GRU features, alive and action masks over the batch, concatenated over
    agents; utilities padded with -inf (and masked out) to the largest group's action count. `hidden` (group -> GRU
    state, advanced in place) continues the groups' recurrence from a stored state (probes/qtran_probe.py, a step at a
    time); without it each sequence starts from zero, as the replay's episodes do."""
    outs = {g: net(mb[f"obs_{g}"], None if hidden is None else hidden[g]) for g, net in agents.items()}
    if hidden is not None:
        hidden.update({g: h for g, (_, h, _) in outs.items()})
    n = max(q.shape[-1] for q, _, _ in outs.values())  # Q (L + 1, B, A, n), h, features (L + 1, B, A, H)
    qs, features, alive, avail = [], [], [], []
    for g, (q, _, f) in outs.items():
        a = mb[f"avail_{g}"].bool() if f"avail_{g}" in mb else torch.ones_like(q, dtype=torch.bool)
        qs.append(F.pad(q, (0, n - q.shape[-1]), value=-torch.inf))
        avail.append(F.pad(a, (0, n - q.shape[-1]), value=False))
        features.append(f)
        alive.append(mb[f"agent_mask_{g}"])
    return torch.cat(qs, 2), torch.cat(features, 2), torch.cat(alive, 2), torch.cat(avail, 2)


def joint_value(q_cf, actions, alive):
    """Q_jt(s, u) from the counterfactual networks: each living agent's Q_jt(s, u_i, u_-i) read at its own u_i, and
    their mean (each is an estimate of the same joint value)."""
    estimates = q_cf.gather(-1, actions[..., None]).squeeze(-1)
    return (estimates * alive).sum(-1) / alive.sum(-1).clamp(min=1.0)


def update(qtran, target, optimizer, rb, args, device, rng):
    """One gradient step on replayed episodes: QTRAN's L_td + w_opt L_opt + w_nopt L_nopt (Son et al. 2019, Eq. 6-9;
    alt: L_nopt-min, Eq. 11): Q_jt learns the team's TD target, and the agents' summed utilities Q' learn to equal
    Q_jt - V at the greedy joint action and to stay at or above it elsewhere, so that the greedy joint action of Q' is
    Q_jt's."""
    batch = rb.sample(args.batch_size, rng)  # (L + 1, B, ...) from a zero state
    if args.standardise_rewards:
        batch["reward"] = standardised_rewards(qtran.reward_norm, batch["reward"], batch["loss_mask"])
    mb = to_torch(batch, device)
    mask = mb["loss_mask"][:-1]  # a step's target needs row t + 1
    q, features, alive, avail = group_outputs(qtran.agents, mb)  # (L + 1, B, N, n), (L + 1, B, N, H), ...
    n, alt = q.shape[-1], args.variant == "alt"
    actions = torch.cat([mb[f"actions_{g}"] for g in qtran.agents], 2)  # (L + 1, B, N)
    greedy_q, greedy = q.masked_fill(~avail, -torch.inf).max(-1)  # each agent's best utility and action
    state = mb["state"]

    def joint(net, features, u, alive, state):  # Q_jt(s, u) (T, B), V (T, B), and alt's Q_jt(s, ., u_-i)
        out, v = net.joint(features, F.one_hot(u, n).float(), alive, state)
        return (joint_value(out, u, alive), v, out) if alt else (out, v, None)

    # L_td: Q_jt(s, u) toward r + gamma Q_jt'(s', u'), u' the online agents' greedy actions (Double Q)
    q_jt, v, counterfactual = joint(qtran, features[:-1], actions[:-1], alive[:-1], state[:-1])
    with torch.no_grad():
        _, target_features, _, _ = group_outputs(target.agents, mb)
        next_q_jt, _, _ = joint(target, target_features[1:], greedy[1:], alive[1:], state[1:])
        targets = mb["reward"][:-1] + args.gamma * (1.0 - mb["terminated"][:-1].float()) * next_q_jt
    td_loss = ((q_jt - targets) ** 2 * mask).sum() / mask.sum().clamp(min=1.0)
    # L_opt: at the greedy joint action, sum_a max Q_a = Q_jt - V (Q_jt held fixed)
    greedy_q_jt, _, _ = joint(qtran, features[:-1], greedy[:-1], alive[:-1], state[:-1])
    best = torch.where(alive[:-1] > 0, greedy_q[:-1], torch.zeros_like(greedy_q[:-1]))  # a dead agent adds nothing
    opt_error = best.sum(-1) - greedy_q_jt.detach() + v
    opt_loss = (opt_error**2 * mask).sum() / mask.sum().clamp(min=1.0)
    chosen = q[:-1].gather(-1, actions[:-1, ..., None]).squeeze(-1) * alive[:-1]  # (L, B, N), a dead agent's 0
    if not alt:  # L_nopt: at the taken joint action, sum_a Q_a(u_a) >= Q_jt - V
        nopt_squared = (chosen.sum(-1) - q_jt.detach() + v).clamp(max=0.0) ** 2
    else:  # L_nopt-min: for each agent i, the min over its actions of Q'(u_i, u_-i) - Q_jt(s, u_i, u_-i) + V is 0
        others = chosen.sum(-1, keepdim=True) - chosen  # sum_{j != i} Q_j(u_j), (L, B, N)
        gap = q[:-1] + others[..., None] - counterfactual.detach() + v[..., None, None]  # (L, B, N, n)
        lowest = gap.masked_fill(~avail[:-1], torch.inf).min(-1).values
        living = alive[:-1] > 0
        nopt_squared = torch.where(living, lowest, 0.0).pow(2).sum(-1) / living.sum(-1).clamp(min=1)  # agents' mean
    nopt_loss = (nopt_squared * mask).sum() / mask.sum().clamp(min=1.0)
    loss = td_loss + args.opt_loss * opt_loss + args.nopt_loss * nopt_loss
    check_finite(loss, "the TD loss", "lower --learning-rate or check the reward scale")
    # UPDATE
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(qtran.parameters(), args.max_grad_norm)
    optimizer.step()
    n_steps = mask.sum().clamp(min=1.0)
    q_values, values = (q_jt * mask).sum() / n_steps, (v * mask).sum() / n_steps
    return dict(
        td_loss=td_loss.item(),
        opt_loss=opt_loss.item(),
        nopt_loss=nopt_loss.item(),
        q_values=q_values.item(),
        v=values.item(),
    )


if __name__ == "__main__":
    cli(Args, main)
