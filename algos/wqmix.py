"""Weighted QMIX, CW and OW (Rashid et al. 2020, arXiv:2006.10800); results: results/simple_spread_v3/wqmix.json"""

import copy
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from buffers import EpisodeReplayBuffer, agent_views, float_tensor, team_fields, team_step, to_torch
from buffers.kernels import nstep_returns, td_lambda
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

ALGO = "wqmix"
CONTINUOUS = "mappo.py, ippo.py, maddpg.py, matd3.py or iddpg.py"  # the scripts for continuous actions


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    num_envs: int = 128
    """parallel training envs"""
    save_buffer: bool = True
    """at Ctrl-C, also write the replay buffer to replay.npz, so --resume replays the same data (else it refills)"""

    # --- WQMIX (the learning groups form one team; its reward is the mean of its agents' rewards) ---
    weighting: Literal["ow", "cw"] = "ow"
    """'ow': optimistic weighting (full weight where Q_tot underestimates the target); 'cw': centrally weighted (full
    weight on the greedy joint action and where the target beats Q*(s, greedy))"""
    weighting_alpha: float = 0.5
    """the weight of every other joint action in the QMIX loss (1: QMIX's unweighted loss)"""
    central_mixing_embed_dim: int = 256
    """width of the unrestricted central mixer Q*"""
    learning_rate: float = 1e-3
    """Adam learning rate"""
    buffer_size: int = 5_000
    """replay capacity in episodes"""
    max_episode_len: int | None = None
    """longest storable episode (default: the env's time limit)"""
    batch_size: int = 32
    """episodes per gradient step"""
    gamma: float = 0.95
    """discount; 0.95 for 25-step MPE episodes, as in mappo.py (results/simple_spread_v3/qmix_tuning.md)"""
    td_lambda: float = 0.6
    """lambda of the TD(lambda) targets (0: one-step targets)"""
    n_step: int = 1
    """n-step targets in place of TD(lambda) (needs --td-lambda 0)"""
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
    """env steps per gradient step (summed over envs): each stored step is replayed ~4 times at the defaults"""
    seq_len: int = 0
    """train on a random window of this many steps per sampled episode (0: whole episodes)"""
    burn_in: int = 0
    """steps that only warm up the GRU state (R2D2): before each --seq-len window, or an episode's first steps"""
    hidden_size: int = 64
    """width of the agents' encoder and GRU"""
    mixing_embed_dim: int = 32
    """width of the mixing network's hidden layer"""
    hypernet_embed: int = 64
    """width of the hypernetworks' hidden layer"""
    share_params: bool = True
    """one agent network per group with an agent-id one-hot (--no-share-params: one network per agent)"""
    max_grad_norm: float = 10.0
    """global gradient-norm clip"""
    log_interval: int = 5_000
    """env steps between TensorBoard points of the losses, epsilon and speed"""
    prioritized: bool = False
    """proportional prioritized sampling of episodes, by their mean |TD error| (Schaul et al. 2016)"""
    prioritized_replay_alpha: float = 0.6
    """--prioritized: how much priorities count (0: uniform)"""
    prioritized_replay_beta: float = 0.4
    """--prioritized: initial importance-sampling exponent, annealed to 1 over the run"""


class RecurrentQ(nn.Module):
    """Linear-ReLU encoder, a GRU over time, a linear Q head (the paper's DRQN agent)."""

    def __init__(self, d_in, n_actions, hidden_size):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, hidden_size), nn.ReLU())
        self.gru = nn.GRU(hidden_size, hidden_size)
        self.head = nn.Linear(hidden_size, n_actions)

    def forward(self, x, h=None):  # x (T, B, d_in), h (1, B, H) -> Q (T, B, n_actions), h
        out, h = self.gru(self.encoder(x), h)
        return self.head(out), h


class GroupQ(nn.Module):
    """One group's utilities Q_a(tau_a, .): one RecurrentQ shared (with an agent-id one-hot), or one per agent."""

    def __init__(self, spec, args):
        super().__init__()
        self.ids = spec.n_agents if args.share_params and spec.n_agents > 1 else 0
        d_in, n = int(np.prod(spec.obs_shape)) + self.ids, 1 if args.share_params else spec.n_agents
        self.nets = nn.ModuleList(RecurrentQ(d_in, spec.action_dim, args.hidden_size) for _ in range(n))

    def forward(self, obs, h=None):  # obs (T, B, A, *obs_shape), h (1, B, A, H) or None -> Q (T, B, A, n), h
        T, B, A = obs.shape[:3]
        x = obs.flatten(3)
        if self.ids:
            x = torch.cat([x, torch.eye(A, device=x.device).expand(T, B, A, A)], -1)
        if len(self.nets) == 1:  # every agent of the group in one batch
            q, h = self.nets[0](x.reshape(T, B * A, -1), None if h is None else h.reshape(1, B * A, -1))
            return q.view(T, B, A, -1), h.view(1, B, A, -1)
        outs = [net(x[:, :, i], None if h is None else h[:, :, i].contiguous()) for i, net in enumerate(self.nets)]
        return torch.stack([q for q, _ in outs], 2), torch.stack([h for _, h in outs], 2)


class Mixer(nn.Module):
    """Q_tot = w2 . elu(W1 q + b1) + V(s), with W1, w2 >= 0 from hypernetworks on the state, so dQ_tot/dQ_a >= 0."""

    def __init__(self, n_agents, state_dim, args):
        super().__init__()
        e, h = args.mixing_embed_dim, args.hypernet_embed
        self.hyper_w1 = nn.Sequential(nn.Linear(state_dim, h), nn.ReLU(), nn.Linear(h, n_agents * e))
        self.hyper_b1 = nn.Linear(state_dim, e)
        self.hyper_w2 = nn.Sequential(nn.Linear(state_dim, h), nn.ReLU(), nn.Linear(h, e))
        self.v = nn.Sequential(nn.Linear(state_dim, e), nn.ReLU(), nn.Linear(e, 1))

    def forward(self, qs, state):  # qs (T, B, N) chosen utilities, state (T, B, S) -> Q_tot (T, B)
        T, B, N = qs.shape
        w1 = self.hyper_w1(state).abs().view(T, B, N, -1)  # abs: the monotonicity constraint
        hidden = F.elu((qs.unsqueeze(-2) @ w1).squeeze(-2) + self.hyper_b1(state))
        return (hidden * self.hyper_w2(state).abs()).sum(-1) + self.v(state).squeeze(-1)


class CentralMixer(nn.Module):
    """Q*(s, u) = MLP(s, q*_1..N) + V(s): an unrestricted (not monotonic) feed-forward mix of the central utilities."""

    def __init__(self, n_agents, state_dim, args):
        super().__init__()
        e = args.central_mixing_embed_dim
        self.net = nn.Sequential(
            nn.Linear(state_dim + n_agents, e), nn.ReLU(), nn.Linear(e, e), nn.ReLU(), nn.Linear(e, 1)
        )
        self.v = nn.Sequential(nn.Linear(state_dim, e), nn.ReLU(), nn.Linear(e, 1))

    def forward(self, qs, state):  # qs (T, B, N) chosen central utilities, state (T, B, S) -> Q* (T, B)
        return (self.net(torch.cat([qs, state], -1)) + self.v(state)).squeeze(-1)


class WQMIX(nn.Module):
    """The team: QMIX's agents and monotonic mixer (they act), and the central Q*'s own agents and mixer (they
    only give the targets and the weights)."""

    def __init__(self, specs, state_dim, args):
        super().__init__()
        n_agents = sum(spec.n_agents for spec in specs.values())
        self.agents = nn.ModuleDict({g: GroupQ(spec, args) for g, spec in specs.items()})
        self.mixer = Mixer(n_agents, state_dim, args)
        self.central_agents = nn.ModuleDict({g: GroupQ(spec, args) for g, spec in specs.items()})
        self.central_mixer = CentralMixer(n_agents, state_dim, args)
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
        q, hidden[g] = agents[g](float_tensor(obs.obs[g], device)[None], hidden[g])
        q = q[0] if avail is None else q[0].masked_fill(~torch.as_tensor(avail, device=device), -torch.inf)
        actions[g] = np.where(rng.random(shape[:2]) < epsilon, uniform, q.argmax(-1).cpu().numpy())
    return actions


# what the weights depend on
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


NETWORK_FLAGS = ("hidden_size", "share_params", "mixing_embed_dim", "hypernet_embed", "central_mixing_embed_dim")
NETWORK_FLAGS += ("standardise_rewards",)  # what the weights (and the reward statistics) depend on


def main(args):
    check_args(
        args,
        (
            args.td_lambda == 0 or args.n_step == 1,
            f"--n-step {args.n_step} and --td-lambda "
            f"{args.td_lambda} are two kinds of target: give --td-lambda 0 with --n-step",
        ),
    )
    device, rng = setup(args)
    env = make_env(args, args.num_envs, args.seed)
    check_discrete(args, env, ALGO, CONTINUOUS)
    learners = list(env.groups)  # the learning groups: make_env acts for the frozen ones
    specs = {g: env.groups[g] for g in learners}
    state_dim = int(np.prod(env.state_shape))
    wqmix = WQMIX(specs, state_dim, args).to(device)
    target = copy.deepcopy(wqmix)
    optimizer = torch.optim.Adam(wqmix.parameters(), lr=args.learning_rate)

    make_greedy = acting(wqmix.agents, specs, args, device, epsilon=0.0)  # evaluation: greedy
    max_len = episode_length(args, env.max_steps)
    rb = EpisodeReplayBuffer(
        args.buffer_size,
        max_len,
        args.num_envs,
        team_fields(specs, env.state_shape),
        alpha=args.prioritized_replay_alpha if args.prioritized else None,
    )
    nets = {"wqmix": wqmix, "target": target}
    run = Run(args, ALGO, env, nets, {"wqmix": optimizer}, rng, make_greedy, network_flags=NETWORK_FLAGS, replay=rb)
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
            actions = act(wqmix.agents, specs, obs, hidden, epsilon, rng, device)
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
                    beta = linear_schedule(
                        args.prioritized_replay_beta, 1.0, args.total_timesteps, global_step
                    )  # to 1 (--prioritized)
                    losses = update(wqmix, target, optimizer, rb, args, device, rng, beta)
                if crossings(global_step, args.num_envs, args.target_network_frequency):
                    soft_update(target, wqmix, args.tau)

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


# --- what the loop calls: the weighted QMIX update ---


def td_targets(batch, next_values, args):
    """n-step or TD(lambda) targets (T, B) of the team's steps, by the compiled kernels over numpy arrays."""
    rewards, terminated = batch["reward"][:-1], batch["terminated"][:-1]
    cut = ~batch["loss_mask"][1:]  # the recursion stops where the next step has no target: an episode's or window's end
    v = next_values.cpu().numpy()
    if args.n_step > 1:
        sums, discounts, last = nstep_returns(rewards, terminated, cut, args.gamma, args.n_step)
        return sums + discounts * np.take_along_axis(v, last, 0)
    return td_lambda(rewards, v, terminated, cut, args.gamma, args.td_lambda)


def qmix_weights(td, targets, greedy_q_star, is_greedy, args):
    """The weight of each step's squared TD error in QMIX's loss: 1 or --weighting-alpha (all (T, B)).

    OW: full weight where Q_tot underestimates the target (td < 0). CW: full weight on the greedy joint action, and
    where the target beats Q*(s, greedy joint action), i.e. where the taken joint action may be the better one.
    """
    full = td < 0 if args.weighting == "ow" else is_greedy | (targets > greedy_q_star)
    return torch.where(full, 1.0, args.weighting_alpha)


def update(wqmix, target, optimizer, rb, args, device, rng, beta):
    """One gradient step on replayed episodes: the central Q* on TD(lambda) targets of Q*(s', greedy joint action
    of QMIX), and QMIX on the same targets, each step weighted 1 or --weighting-alpha."""
    batch = rb.sample(args.batch_size, rng, beta, args.seq_len, args.burn_in)  # (L + 1, B, ...) from a zero state
    if args.standardise_rewards:
        batch["reward"] = standardised_rewards(wqmix.reward_norm, batch["reward"], batch["loss_mask"])
    mb = to_torch(batch, device)
    mask = mb["loss_mask"][:-1]  # a step's target needs row t + 1
    chosen, central_chosen, central_greedy, is_greedy = [], [], [], []
    for g, agents in wqmix.agents.items():
        q = agents(mb[f"obs_{g}"])[0]  # (L + 1, B, A, n)
        alive, actions = mb[f"agent_mask_{g}"], mb[f"actions_{g}"][..., None]  # a dead agent's utility is 0 in the mix
        chosen.append(q[:-1].gather(-1, actions[:-1]).squeeze(-1) * alive[:-1])
        central_q = wqmix.central_agents[g](mb[f"obs_{g}"])[0]
        central_chosen.append(central_q[:-1].gather(-1, actions[:-1]).squeeze(-1) * alive[:-1])
        with torch.no_grad():  # QMIX's greedy joint action (at every step), valued by the target Q*'s agents
            avail = mb.get(f"avail_{g}")
            best = (q if avail is None else q.masked_fill(avail == 0, -torch.inf)).argmax(-1, keepdim=True)
            central_greedy.append(target.central_agents[g](mb[f"obs_{g}"])[0].gather(-1, best).squeeze(-1) * alive)
            is_greedy.append((best[:-1] == actions[:-1]).squeeze(-1) | (alive[:-1] == 0))
    q_tot = wqmix.mixer(torch.cat(chosen, -1), mb["state"][:-1])  # (L, B)
    q_star = wqmix.central_mixer(torch.cat(central_chosen, -1), mb["state"][:-1])
    # TARGETS: TD(lambda) (or n-step) over the target Q* of QMIX's greedy joint action at the next steps
    with torch.no_grad():
        greedy_q_star = target.central_mixer(torch.cat(central_greedy, -1), mb["state"])  # (L + 1, B)
        targets = float_tensor(td_targets(batch, greedy_q_star[1:], args), device)
    td = q_tot - targets
    w = qmix_weights(td.detach(), targets, greedy_q_star[:-1], torch.cat(is_greedy, -1).all(-1), args)
    weights = mb["weights"][None] if args.prioritized else 1.0  # importance sampling of prioritized episodes
    n = mask.sum().clamp(min=1.0)
    qmix_loss = (weights * w * mask * td**2).sum() / n
    central_loss = (weights * mask * (q_star - targets) ** 2).sum() / n
    loss = qmix_loss + central_loss
    check_finite(
        loss, "the TD loss", "lower --learning-rate or check the rewards", qmix=qmix_loss, central=central_loss
    )
    # UPDATE
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(wqmix.parameters(), args.max_grad_norm)
    optimizer.step()
    if args.prioritized:  # an episode's priority: its mean |TD error| of Q*
        err = ((q_star - targets) * mask).detach().abs().sum(0) / mask.sum(0).clamp(min=1.0)
        rb.update_priorities(batch["indices"], err.cpu().numpy())
    return dict(
        td_loss=qmix_loss.item(),
        central_loss=central_loss.item(),
        q_values=((q_tot * mask).sum() / n).item(),
        weight=((w * mask).sum() / n).item(),
    )


def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:
    """Group `group` of a checkpoint as an actor (epsilon 0, or --end-e if not greedy): --opponent, --self-play,
    results/tournament.py (runtime.opponents)."""
    args = checkpoint_args(Args, ckpt["args"])
    agents = GroupQ(spec, args).to(device)
    agents.load_state_dict(sub_state(ckpt["nets"]["wqmix"], f"agents.{group}."))
    return acting({group: agents}, {group: spec}, args, device, 0.0 if greedy else args.end_e)


if __name__ == "__main__":
    cli(Args, main)
