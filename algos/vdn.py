"""VDN (Sunehag et al. 2018, arXiv:1706.05296); results: results/simple_spread_v3/vdn.json"""

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

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

ALGO = "vdn"
CONTINUOUS = "mappo.py, ippo.py, maddpg.py, matd3.py or iddpg.py"  # the scripts for continuous actions


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    num_envs: int = 128
    """parallel training envs"""
    save_buffer: bool = True
    """at Ctrl-C, also write the replay buffer to replay.npz, so --resume replays the same data (else it refills)"""

    # --- VDN (the learning groups form one team; its reward is the mean of its agents' rewards) ---
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
    standardise_rewards); off by default, as on MPE's dense rewards; on Foraging-8x8-2p-2f-coop's sparse ones it
    is what lets iql.py, vdn.py and qmix.py solve it in 2M steps (results/Foraging-8x8-2p-2f-coop/reward_scale.md;
    wqmix.py has it too, unmeasured)"""
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


class VDN(nn.Module):
    """The team: one GroupQ per learning group; Q_tot is the sum of its agents' utilities."""

    def __init__(self, specs, args):
        super().__init__()
        self.agents = nn.ModuleDict({g: GroupQ(spec, args) for g, spec in specs.items()})
        if args.standardise_rewards:  # the running statistics of the replayed team rewards, checkpointed
            self.reward_norm = RunningNorm()

    @staticmethod
    def mixer(qs):  # qs (T, B, N) chosen utilities -> Q_tot (T, B)
        return qs.sum(-1)


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
    agents.load_state_dict(sub_state(ckpt["nets"]["vdn"], f"agents.{group}."))
    return acting({group: agents}, {group: spec}, args, device, 0.0 if greedy else args.end_e)


NETWORK_FLAGS = ("hidden_size", "share_params", "standardise_rewards")  # what the weights (and statistics) depend on


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
    vdn = VDN(specs, args).to(device)
    target = copy.deepcopy(vdn)
    optimizer = torch.optim.Adam(vdn.parameters(), lr=args.learning_rate)

    make_greedy = acting(vdn.agents, specs, args, device, epsilon=0.0)  # evaluation: greedy
    max_len = episode_length(args, env.max_steps)
    rb = EpisodeReplayBuffer(
        args.buffer_size,
        max_len,
        args.num_envs,
        team_fields(specs),
        alpha=args.prioritized_replay_alpha if args.prioritized else None,
    )
    nets = {"vdn": vdn, "target": target}
    run = Run(args, ALGO, env, nets, {"vdn": optimizer}, rng, make_greedy, network_flags=NETWORK_FLAGS, replay=rb)
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
            actions = act(vdn.agents, specs, obs, hidden, epsilon, rng, device)
            # STEP
            step = env.step(actions)
            global_step += args.num_envs
            # STORE: the team's step into each env's running episode; finished episodes close with their final
            # observation (a truncated episode bootstraps from it)
            rb.add(**team_step(obs, actions, step, specs))
            if (done := np.flatnonzero(step.done)).size:
                final = step.final
                rb.finish(done, **agent_views(final, specs, envs=done))
                hidden = reset_finished(hidden, step.done, env_dim=1)  # the next episode starts from a zero state
            run.log_episodes(step.episodes, global_step)
            obs = step.next

            # TARGETS and UPDATE: one gradient step per --train-frequency env steps
            if global_step > train_start and len(rb) >= args.batch_size:
                for _ in range(crossings(global_step, args.num_envs, args.train_frequency)):
                    beta = linear_schedule(
                        args.prioritized_replay_beta, 1.0, args.total_timesteps, global_step
                    )  # to 1 (--prioritized)
                    losses = update(vdn, target, optimizer, rb, args, device, rng, beta)
                if crossings(global_step, args.num_envs, args.target_network_frequency):
                    soft_update(target, vdn, args.tau)

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


# --- what the loop calls: the VDN update ---


def td_targets(batch, next_values, args):
    """n-step or TD(lambda) targets (T, B) of the team's steps, by the compiled kernels over numpy arrays."""
    rewards, terminated = batch["reward"][:-1], batch["terminated"][:-1]
    cut = ~batch["loss_mask"][1:]  # the recursion stops where the next step has no target: an episode's or window's end
    v = next_values.cpu().numpy()
    if args.n_step > 1:
        sums, discounts, last = nstep_returns(rewards, terminated, cut, args.gamma, args.n_step)
        return sums + discounts * np.take_along_axis(v, last, 0)
    return td_lambda(rewards, v, terminated, cut, args.gamma, args.td_lambda)


def update(vdn, target, optimizer, rb, args, device, rng, beta):
    """One gradient step on replayed episodes: Double-Q TD(lambda) targets of the summed Q_tot, squared error."""
    batch = rb.sample(args.batch_size, rng, beta, args.seq_len, args.burn_in)  # (L + 1, B, ...) from a zero state
    if args.standardise_rewards:
        batch["reward"] = standardised_rewards(vdn.reward_norm, batch["reward"], batch["loss_mask"])
    mb = to_torch(batch, device)
    mask = mb["loss_mask"][:-1]  # a step's target needs row t + 1
    chosen, next_q = [], []
    for g, agents in vdn.agents.items():
        q = agents(mb[f"obs_{g}"])[0]  # (L + 1, B, A, n)
        alive = mb[f"agent_mask_{g}"]  # a dead agent's utility is 0 in the mix
        chosen.append(q[:-1].gather(-1, mb[f"actions_{g}"][:-1, ..., None]).squeeze(-1) * alive[:-1])
        with torch.no_grad():  # Double Q: the online agents pick the next actions, the target agents evaluate them
            avail = mb.get(f"avail_{g}")
            q_next = q[1:] if avail is None else q[1:].masked_fill(avail[1:] == 0, -torch.inf)  # available only
            best = q_next.argmax(-1, keepdim=True)  # the online agents' pick
            target_q_next = target.agents[g](mb[f"obs_{g}"])[0][1:]  # the target agents' values of it
            next_q.append(target_q_next.gather(-1, best).squeeze(-1) * alive[1:])
    q_tot = vdn.mixer(torch.cat(chosen, -1))  # (L, B)
    # TARGETS: TD(lambda) (or n-step) over the target agents' Q_tot of the next steps
    with torch.no_grad():
        next_q_tot = target.mixer(torch.cat(next_q, -1))
        targets = float_tensor(td_targets(batch, next_q_tot, args), device)
    td = (q_tot - targets) * mask
    weights = mb["weights"][None] if args.prioritized else 1.0  # importance sampling of prioritized episodes
    n = mask.sum().clamp(min=1.0)
    loss = (weights * td**2).sum() / n
    check_finite(loss, "the TD loss", "lower --learning-rate or check the reward scale")
    # UPDATE
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(vdn.parameters(), args.max_grad_norm)
    optimizer.step()
    if args.prioritized:  # an episode's priority: its mean |TD error|
        err = td.detach().abs().sum(0) / mask.sum(0).clamp(min=1.0)
        rb.update_priorities(batch["indices"], err.cpu().numpy())
    return dict(td_loss=loss.item(), q_values=((q_tot * mask).sum() / n).item())


if __name__ == "__main__":
    cli(Args, main)
