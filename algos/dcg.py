"""Deep Coordination Graphs (Böhmer, Kurin and Whiteson 2020, arXiv:1910.00091)"""

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
    groups_state,
    linear_schedule,
    make_env,
    reset_finished,
    setup,
    soft_update,
    standardised_rewards,
)

ALGO = "dcg"
CONTINUOUS = "mappo.py, ippo.py, maddpg.py, matd3.py or iddpg.py"  # the scripts for continuous actions


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    num_envs: int = 128
    """parallel training envs"""
    save_buffer: bool = True
    """at Ctrl-C, also write the replay buffer to replay.npz, so --resume replays the same data (else it refills)"""

    # --- DCG (the learning groups form one team; its reward is the mean of its agents' rewards) ---
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
    """width of the agents' encoder and GRU, whose features feed the utility and payoff heads"""
    graph: Literal["full", "line", "cycle", "star", "none"] = "full"
    """the coordination graph over the team's agents: every pair (the paper's DCG), a chain, a ring, a star around
    the first agent, or no edges (then Q is the mean of the utilities: VDN)"""
    payoff_rank: int = 0
    """rank of each edge's payoff matrix as a sum of outer products (the paper's low-rank DCG); 0: full rank"""
    msg_iterations: int = 8
    """rounds of max-sum message passing that find the greedy joint action"""
    share_params: bool = True
    """one agent network per group with an agent-id one-hot (--no-share-params: one network per agent)"""
    max_grad_norm: float = 10.0
    """global gradient-norm clip"""
    log_interval: int = 5_000
    """env steps between TensorBoard points of the losses, epsilon and speed"""


class RecurrentQ(nn.Module):
    """Linear-ReLU encoder, a GRU over time, a linear head: the agent's utility f_i (the paper's DRQN agent)."""

    def __init__(self, d_in, n_actions, hidden_size):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, hidden_size), nn.ReLU())
        self.gru = nn.GRU(hidden_size, hidden_size)
        self.head = nn.Linear(hidden_size, n_actions)

    def forward(self, x, h=None):  # x (T, B, d_in), h (1, B, H) -> f_i (T, B, n_actions), h, GRU outputs (T, B, H)
        out, h = self.gru(self.encoder(x), h)
        return self.head(out), h, out


class GroupQ(nn.Module):
    """One group's utilities f_i(tau_i, .): one RecurrentQ shared (with an agent-id one-hot), or one per agent."""

    def __init__(self, spec, args):
        super().__init__()
        self.ids = spec.n_agents if args.share_params and spec.n_agents > 1 else 0
        d_in, n = int(np.prod(spec.obs_shape)) + self.ids, 1 if args.share_params else spec.n_agents
        self.nets = nn.ModuleList(RecurrentQ(d_in, spec.action_dim, args.hidden_size) for _ in range(n))

    def forward(
        self, obs, h=None
    ):  # obs (T, B, A, *obs_shape), h (1, B, A, H) or None -> f_i (T, B, A, n), h, features
        T, B, A = obs.shape[:3]
        x = obs.flatten(3)
        if self.ids:
            x = torch.cat([x, torch.eye(A, device=x.device).expand(T, B, A, A)], -1)
        if len(self.nets) == 1:  # every agent of the group in one batch
            q, h, out = self.nets[0](x.reshape(T, B * A, -1), None if h is None else h.reshape(1, B * A, -1))
            return q.view(T, B, A, -1), h.view(1, B, A, -1), out.view(T, B, A, -1)
        outs = [net(x[:, :, i], None if h is None else h[:, :, i].contiguous()) for i, net in enumerate(self.nets)]
        return tuple(torch.stack(parts, 2) for parts in zip(*outs, strict=True))


class DCG(nn.Module):
    """The team's coordination graph: one GroupQ per learning group gives every agent's utilities f_i and GRU
    features h_i, one payoff head shared by all edges gives f_ij(., .) from [h_i, h_j]. Q(s, u) is the mean utility
    plus the mean payoff (Eq. 3). Actions are padded to `n_actions`, the largest group's action count."""

    def __init__(self, specs, args, n_actions):
        super().__init__()
        self.agents = nn.ModuleDict({g: GroupQ(spec, args) for g, spec in specs.items()})
        self.n, self.rank = n_actions, args.payoff_rank
        self.action_dims = {g: spec.action_dim for g, spec in specs.items()}
        out = 2 * self.rank * n_actions if self.rank else n_actions * n_actions
        self.payoff = nn.Linear(2 * args.hidden_size, out)
        edges_from, edges_to = graph_edges(args.graph, sum(spec.n_agents for spec in specs.values()))
        self.register_buffer("edges_from", edges_from, persistent=False)
        self.register_buffer("edges_to", edges_to, persistent=False)
        if args.standardise_rewards:  # the running statistics of the replayed team rewards, checkpointed
            self.reward_norm = RunningNorm()

    def utilities(self, obs, hidden=None):
        """Every agent's utilities (padded with zeros), GRU features and new GRU state, concatenated over groups:
        obs group -> (T, B, A, *obs_shape) -> f_i (T, B, N, n), features (T, B, N, H), group -> hidden."""
        outs = {g: net(obs[g], None if hidden is None else hidden[g]) for g, net in self.agents.items()}
        f_i = torch.cat([F.pad(q, (0, self.n - q.shape[-1])) for q, _, _ in outs.values()], 2)
        features = torch.cat([f for _, _, f in outs.values()], 2)
        return f_i, features, {g: h for g, (_, h, _) in outs.items()}

    def payoffs(self, features):
        """f_ij(u_i, u_j) of every edge, symmetric in its two ends (the average of both orders, as in the paper):
        (..., N, H) -> (..., E, n, n), row u_i and column u_j."""
        h_i, h_j = features[..., self.edges_from, :], features[..., self.edges_to, :]
        both = self.payoff(torch.stack([torch.cat([h_i, h_j], -1), torch.cat([h_j, h_i], -1)]))
        if self.rank:  # a sum of `rank` outer products of a left and a right vector
            left, right = both.unflatten(-1, (self.rank, 2, self.n)).unbind(-2)
            matrices = (left[..., :, None] * right[..., None, :]).sum(-3)
        else:
            matrices = both.unflatten(-1, (self.n, self.n))
        return (matrices[0] + matrices[1].transpose(-1, -2)) / 2

    def q_value(self, f_i, f_ij, actions, alive):
        """Q(s, u) = 1/|V| sum_i f_i(u_i) + 1/|E| sum_ij f_ij(u_i, u_j), a dead agent's terms 0:
        (..., N, n), (..., E, n, n), (..., N) actions, (..., N) alive -> (...)."""
        utility = f_i.gather(-1, actions[..., None]).squeeze(-1) * alive
        q = utility.sum(-1) / f_i.shape[-2]
        if f_ij.shape[-3]:
            i, j = self.edges_from, self.edges_to
            pair = f_ij.flatten(-2).gather(-1, (actions[..., i] * self.n + actions[..., j])[..., None]).squeeze(-1)
            q = q + (pair * alive[..., i] * alive[..., j]).sum(-1) / f_ij.shape[-3]
        return q


@torch.no_grad()
def act(dcg, specs, obs, hidden, epsilon, rng, device, iterations):
    """The team's greedy joint action by max-sum, then epsilon-greedy per agent over its available actions;
    `hidden` (group -> GRU state) advances."""
    f_i, features, new = dcg.utilities({g: float_tensor(obs.obs[g], device)[None] for g in specs}, hidden)
    hidden.update(new)
    # a copy: the env's mask is read-only
    alive = {g: torch.tensor(obs.agent_mask[g], dtype=torch.float32, device=device) for g in specs}
    avail = {g: torch.tensor(a, device=device) for g, a in obs.avail_actions.items() if g in specs}
    avail = team_avail(avail, alive, dcg.action_dims, dcg.n)  # (E, N, n)
    alive = torch.cat(list(alive.values()), 1)
    greedy = max_sum(dcg, f_i[0], dcg.payoffs(features[0]), avail, alive, iterations).cpu().numpy()  # (E, N)
    uniform = np.argmax(rng.random(avail.shape) * avail.cpu().numpy(), -1)  # a random available action
    chosen = np.where(rng.random(greedy.shape) < epsilon, uniform, greedy)
    return dict(zip(specs, np.split(chosen, np.cumsum([s.n_agents for s in specs.values()])[:-1], 1), strict=True))


def acting(dcg, specs, args, device, epsilon) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: epsilon-greedy, each episode from a zero GRU state (the
    evaluations, and a checkpoint playing a group: `actor`)."""

    def make(num_envs, rng):
        hidden = {
            g: torch.zeros(1, num_envs, spec.n_agents, args.hidden_size, device=device) for g, spec in specs.items()
        }

        def act_fn(obs, done):
            nonlocal hidden
            hidden = reset_finished(hidden, done, env_dim=1)  # nn.GRU's states (1, E, A, H)
            return act(dcg, specs, obs, hidden, epsilon, rng, device, args.msg_iterations)

        return act_fn

    return make


def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:
    """Group `group` of a checkpoint as an actor (epsilon 0, or --end-e if not greedy), its agents coordinated by
    the same kind of graph among themselves: --opponent, --self-play, results/tournament.py (runtime.opponents)."""
    return team_actor(ckpt, {group: spec}, device, greedy)


def team_actor(ckpt, specs, device, greedy=True) -> MakePolicy:
    """The groups `specs` of a checkpoint as one team on one graph, as in training (runtime.opponents.load_team)."""
    args = checkpoint_args(Args, ckpt["args"])
    out = ckpt["nets"]["dcg"]["payoff.bias"].numel()
    n_actions = out // (2 * args.payoff_rank) if args.payoff_rank else round(out**0.5)
    dcg = DCG(specs, args, n_actions).to(device)
    dcg.load_state_dict(groups_state(ckpt["nets"]["dcg"], specs, ("agents",)))
    return acting(dcg, specs, args, device, 0.0 if greedy else args.end_e)


NETWORK_FLAGS = ("hidden_size", "share_params", "payoff_rank", "standardise_rewards")  # what the networks depend on


def main(args):
    check_args(
        args,
        (args.payoff_rank >= 0, "--payoff-rank must be >= 0 (0: full-rank payoff matrices)"),
        (args.msg_iterations >= 1, "--msg-iterations must be >= 1"),
    )
    device, rng = setup(args)
    env = make_env(args, args.num_envs, args.seed)
    check_discrete(args, env, ALGO, CONTINUOUS)
    learners = list(env.groups)  # the learning groups: make_env acts for the frozen ones
    specs = {g: env.groups[g] for g in learners}
    dcg = DCG(specs, args, max(spec.action_dim for spec in specs.values())).to(device)
    target = copy.deepcopy(dcg)
    optimizer = torch.optim.Adam(dcg.parameters(), lr=args.learning_rate)

    make_greedy = acting(dcg, specs, args, device, epsilon=0.0)  # evaluation: greedy
    max_len = episode_length(args, env.max_steps)
    rb = EpisodeReplayBuffer(args.buffer_size, max_len, args.num_envs, team_fields(specs))
    nets = {"dcg": dcg, "target": target}
    run = Run(args, ALGO, env, nets, {"dcg": optimizer}, rng, make_greedy, network_flags=NETWORK_FLAGS, replay=rb)
    writer, global_step = run.writer, run.global_step
    train_start = global_step + (0 if run.replay_restored else args.learning_starts)  # else the buffer refills
    hidden = {
        g: torch.zeros(1, args.num_envs, spec.n_agents, args.hidden_size, device=device) for g, spec in specs.items()
    }
    obs, hidden, losses = run.begin(env.reset(), hidden=hidden, losses={})  # --resume: from last.pt, with the env
    with run:
        while global_step < args.total_timesteps:
            # ACT: the greedy joint action by message passing on the graph, then epsilon-greedy per agent
            epsilon = linear_schedule(
                args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
            )
            actions = act(dcg, specs, obs, hidden, epsilon, rng, device, args.msg_iterations)
            # STEP
            step = env.step(actions)
            global_step += args.num_envs
            # STORE: the team's step into each env's running episode; finished episodes close with their final
            # observation (a truncated episode bootstraps from it)
            rb.add(**team_step(obs, actions, step, specs))
            if (done := np.flatnonzero(step.done)).size:
                rb.finish(done, **agent_views(step.final, specs, envs=done))
                hidden = reset_finished(hidden, step.done, env_dim=1)  # the next episode starts from a zero state
            run.log_episodes(step.episodes, global_step)
            obs = step.next

            # TARGETS and UPDATE: one gradient step per --train-frequency env steps
            if global_step > train_start and len(rb) >= args.batch_size:
                for _ in range(crossings(global_step, args.num_envs, args.train_frequency)):
                    losses = update(dcg, target, optimizer, rb, args, device, rng)
                if crossings(global_step, args.num_envs, args.target_network_frequency):
                    soft_update(target, dcg, args.tau)

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


# --- what the loop calls: the graph, max-sum and the update ---


def graph_edges(graph, n_agents):
    """The coordination graph's edges (i, j), i < j, as two index tensors."""
    pairs = {
        "full": [(i, j) for i in range(n_agents) for j in range(i + 1, n_agents)],
        "line": [(i, i + 1) for i in range(n_agents - 1)],
        "cycle": [(i, (i + 1) % n_agents) for i in range(n_agents)] if n_agents > 2 else [(0, 1)][: n_agents - 1],
        "star": [(0, j) for j in range(1, n_agents)],
        "none": [],
    }[graph]
    i, j = zip(*pairs, strict=True) if pairs else ((), ())
    return torch.tensor(i, dtype=torch.long), torch.tensor(j, dtype=torch.long)


@torch.no_grad()
def max_sum(dcg, f_i, f_ij, avail, alive, iterations):
    """The joint action that maximizes Q by max-sum message passing (the paper's Algorithm 3): each edge sends
    both ends, for each of their actions, the best the other end can add; messages are normalized to mean 0,
    and the best joint action seen in any round is kept (the anytime extension, Kok and Vlassis 2006).
    Exact on a graph without cycles; on a dense graph an approximation. (..., N, n), (..., E, n, n) -> (..., N)."""
    i, j = dcg.edges_from, dcg.edges_to
    alive = alive.double()  # a dead agent's terms are out of Q, and out of its maximization
    own = (f_i.double() * alive[..., None] / f_i.shape[-2]).masked_fill(~avail, -torch.inf)  # doubles, as the paper
    if not len(i) or not iterations:
        return own.argmax(-1)
    pair = f_ij.double() * (alive[..., i] * alive[..., j])[..., None, None] / len(i)
    utils = own
    to_j, to_i = utils.new_zeros(2, *f_ij.shape[:-1])  # (..., E, n): the messages each edge sends either end
    best, best_q = own.argmax(-1), torch.full(f_i.shape[:-2], -torch.inf, device=f_i.device)
    for _ in range(iterations):
        to_j, to_i = (
            ((utils[..., i, :] - to_i)[..., :, None] + pair).amax(-2),  # max over u_i, for each u_j
            ((utils[..., j, :] - to_j)[..., :, None] + pair.transpose(-1, -2)).amax(-2),  # over u_j, each u_i
        )
        to_j, to_i = to_j - to_j.mean(-1, keepdim=True), to_i - to_i.mean(-1, keepdim=True)
        incoming = torch.zeros_like(utils).index_add(-2, j, to_j).index_add(-2, i, to_i)
        utils = own + incoming
        actions = utils.argmax(-1)
        q = dcg.q_value(f_i, f_ij, actions, alive)
        better = q > best_q
        best, best_q = torch.where(better[..., None], actions, best), torch.where(better, q, best_q)
    return best


def team_avail(avail, alive, action_dims, n):
    """Every agent's available actions, concatenated over groups and padded to n actions (a padded one never):
    group -> (..., A, n_g) bool where the group has action masks, group -> alive (..., A) -> (..., N, n)."""
    parts = []
    for g, d in action_dims.items():
        a = avail[g] if g in avail else torch.ones(*alive[g].shape, d, dtype=torch.bool, device=alive[g].device)
        parts.append(F.pad(a, (0, n - d)))
    return torch.cat(parts, -2)


def update(dcg, target, optimizer, rb, args, device, rng):
    """One gradient step on replayed episodes: Q(s_t, u_t) toward r_t + gamma Q'(s_t+1, u*), with u* the online
    graph's greedy joint action by max-sum and Q' the target graph's value of it (Double Q, the paper's
    Algorithm 1); utilities, payoffs and the GRU learn together through Q's TD error."""
    batch = rb.sample(args.batch_size, rng)  # (L + 1, B, ...) from a zero state
    if args.standardise_rewards:
        batch["reward"] = standardised_rewards(dcg.reward_norm, batch["reward"], batch["loss_mask"])
    mb = to_torch(batch, device)
    mask = mb["loss_mask"][:-1]  # a step's target needs row t + 1
    obs = {g: mb[f"obs_{g}"] for g in dcg.agents}
    actions = torch.cat([mb[f"actions_{g}"] for g in dcg.agents], 2)  # (L + 1, B, N)
    avail = {g: mb[f"avail_{g}"].bool() for g in dcg.agents if f"avail_{g}" in mb}
    alive = {g: mb[f"agent_mask_{g}"] for g in dcg.agents}
    avail = team_avail(avail, alive, dcg.action_dims, dcg.n)  # (L + 1, B, N, n)
    alive = torch.cat(list(alive.values()), 2)
    f_i, features, _ = dcg.utilities(obs)  # (L + 1, B, N, n), (L + 1, B, N, H)
    f_ij = dcg.payoffs(features)  # (L + 1, B, E, n, n)
    q = dcg.q_value(f_i[:-1], f_ij[:-1], actions[:-1], alive[:-1])
    with torch.no_grad():
        greedy = max_sum(dcg, f_i[1:], f_ij[1:], avail[1:], alive[1:], args.msg_iterations)
        target_f_i, target_features, _ = target.utilities(obs)
        next_q = target.q_value(target_f_i[1:], target.payoffs(target_features[1:]), greedy, alive[1:])
        targets = mb["reward"][:-1] + args.gamma * (1.0 - mb["terminated"][:-1].float()) * next_q
    td_loss = ((q - targets) ** 2 * mask).sum() / mask.sum().clamp(min=1.0)
    check_finite(td_loss, "the TD loss", "lower --learning-rate or check the reward scale")
    # UPDATE
    optimizer.zero_grad()
    td_loss.backward()
    nn.utils.clip_grad_norm_(dcg.parameters(), args.max_grad_norm)
    optimizer.step()
    return dict(td_loss=td_loss.item(), q_values=((q * mask).sum() / mask.sum().clamp(min=1.0)).item())


if __name__ == "__main__":
    cli(Args, main)
