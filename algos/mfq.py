"""MF-Q, mean-field Q-learning (Yang et al. 2018, arXiv:1802.05438)"""

import copy
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from buffers import ReplayBuffer, float_tensor, to_torch
from buffers.kernels import neighbour_mean_actions
from runtime import (
    ArgumentError,
    MakePolicy,
    MultiAgentArgs,
    Run,
    check_args,
    check_discrete,
    check_finite,
    checkpoint_args,
    cli,
    crossings,
    linear_schedule,
    make_env,
    setup,
    soft_update,
    sub_state,
)

ALGO = "mfq"
CONTINUOUS = "mappo.py, ippo.py, maddpg.py, matd3.py or iddpg.py"  # the scripts for continuous actions


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    num_envs: int = 16
    """parallel training envs"""
    save_buffer: bool = True
    """at Ctrl-C, also write the replay buffer to replay.npz, so --resume replays the same data (else it refills)"""

    # --- MF-Q (every agent's Q(o, a, mean action of its neighbours); a group's agents share the network) ---
    mean_over: Literal["auto", "view", "group"] = "auto"
    """the neighbours whose actions are averaged: 'view' (the agents within --view-radius, on grid envs),
    'group' (every other living agent of the group), or 'auto' (view where the env has positions, else group)"""
    view_radius: float = 6.0
    """--mean-over view: the neighbourhood's radius in cells (MAgent2 battle's view range is a circle of 6)"""
    learning_rate: float = 1e-4
    """Adam learning rate (the authors' battle setting)"""
    buffer_size: int = 100_000
    """replay capacity in agent-steps of the largest learning group: it holds buffer_size // agents env steps
    (battle_v4: 1,234 env steps of 81 agents a side, ~1.4 GB; simple_spread_v3: 33,333)"""
    batch_size: int = 64
    """env steps per gradient step (each with every agent of the group)"""
    gamma: float = 0.95
    """discount"""
    tau: float = 0.005
    """target update rate: a Polyak (soft) update after every gradient step (1: a hard copy)"""
    temperature_start: float = 1.0
    """Boltzmann temperature of the policy softmax(Q / T) at the start"""
    temperature_end: float = 0.1
    """Boltzmann temperature at the end of its schedule"""
    temperature_fraction: float = 0.8
    """fraction of --total-timesteps over which the temperature decays linearly"""
    learning_starts: int = 10_000
    """env steps of experience collected before learning starts"""
    train_frequency: int = 64
    """env steps per gradient step (summed over envs)"""
    hidden_size: int = 64
    """width of the observation and mean-action encoders and of the Q head"""
    max_grad_norm: float = 10.0
    """global gradient-norm clip"""
    log_interval: int = 5_000
    """env steps between TensorBoard points of the losses, temperature and speed"""


class MeanFieldQ(nn.Module):
    """Q(o, ., a_mean): an observation encoder and a mean-action encoder, concatenated, then a Q head."""

    def __init__(self, spec, args):
        super().__init__()
        h, n = args.hidden_size, spec.action_dim
        self.obs = nn.Sequential(nn.Linear(int(np.prod(spec.obs_shape)), h), nn.ReLU(), nn.Linear(h, h), nn.ReLU())
        self.mean = nn.Sequential(nn.Linear(n, h), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(2 * h, h), nn.ReLU(), nn.Linear(h, n))

    def forward(self, obs, mean):  # obs (..., A, *obs_shape), mean (..., A, n) -> Q (..., A, n)
        x = obs.flatten(mean.dim() - 1)  # each agent's observation as one vector
        return self.head(torch.cat([self.obs(x), self.mean(mean)], -1))


class MFQ(nn.Module):
    """One MeanFieldQ per learning group."""

    def __init__(self, specs, args):
        super().__init__()
        self.agents = nn.ModuleDict({g: MeanFieldQ(spec, args) for g, spec in specs.items()})


def masked_logits(q, avail):
    return q if avail is None else q.masked_fill(avail == 0, -torch.inf)


def boltzmann_value(q_policy, q_value, temperature, avail=None):
    """sum_a pi(a) q_value(a), pi = softmax(q_policy / T) over the available actions: MF-Q's v^MF. At T -> 0 it is
    q_value at the argmax of q_policy (the max, when both are the same Q)."""
    logits = masked_logits(q_policy, avail)
    if temperature == 0:
        return q_value.gather(-1, logits.argmax(-1, keepdim=True)).squeeze(-1)
    return (torch.softmax(logits / temperature, -1) * q_value).sum(-1)


def mean_actions(obs, g, actions, n, args):
    """The neighbours' mean one-hot action of every agent of group g (E, A, n), by the compiled kernel."""
    radius = args.view_radius if g in obs.positions and args.mean_over != "group" else None
    return neighbour_mean_actions(obs.positions.get(g), obs.agent_mask[g], actions, n, radius)


@torch.no_grad()
def act(agents, specs, obs, means, temperature, rng, device, args, greedy=False):
    """Every group's actions: a sample of softmax(Q(o, ., previous mean) / T) over the available actions (greedy: the
    argmax), and the neighbours' mean of these actions, for the next step and for the replay."""
    actions, new_means = {}, {}
    for g, spec in specs.items():
        avail = obs.avail_actions.get(g)
        q = masked_logits(
            agents[g](float_tensor(obs.obs[g], device), float_tensor(means[g], device)),
            None if avail is None else torch.as_tensor(avail, device=device),
        )
        if greedy:
            actions[g] = q.argmax(-1).cpu().numpy()
        else:  # Gumbel-max: a sample of the Boltzmann policy from the script's own numpy stream
            gumbel = -np.log(-np.log(rng.random(q.shape)))
            actions[g] = (q.cpu().numpy() / temperature + gumbel).argmax(-1)
        new_means[g] = mean_actions(obs, g, actions[g], spec.action_dim, args)
    return actions, new_means


def zero_means(specs, num_envs):
    return {g: np.zeros((num_envs, s.n_agents, s.action_dim), np.float32) for g, s in specs.items()}


def acting(agents, specs, args, device, greedy=True) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: the policy on the previous step's mean action, zeros at an
    episode's start (the evaluations, and a checkpoint playing a group: `actor`)."""

    def make(num_envs, rng):
        means = zero_means(specs, num_envs)

        def act_fn(obs, done):
            nonlocal means
            if done is not None:
                for m in means.values():
                    m[done] = 0.0
            actions, means = act(agents, specs, obs, means, args.temperature_end, rng, device, args, greedy)
            return actions

        return act_fn

    return make


def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:
    """Group `group` of a checkpoint as an actor (greedy, or Boltzmann at --temperature-end): --opponent,
    --self-play, results/tournament.py (runtime.opponents)."""
    args = checkpoint_args(Args, ckpt["args"])
    agents = MeanFieldQ(spec, args).to(device)
    agents.load_state_dict(sub_state(ckpt["nets"]["mfq"], f"agents.{group}."))
    return acting(nn.ModuleDict({group: agents}), {group: spec}, args, device, greedy)


NETWORK_FLAGS = ("hidden_size",)  # what the weights depend on


def main(args):
    check_args(
        args,
        (args.view_radius >= 0, f"--view-radius {args.view_radius} must be >= 0"),
        (
            min(args.temperature_start, args.temperature_end) > 0,
            "--temperature-start and --temperature-end must be > 0",
        ),
        (0 <= args.temperature_fraction <= 1, "--temperature-fraction must lie in [0, 1]"),
    )
    device, rng = setup(args)
    env = make_env(args, args.num_envs, args.seed)
    check_discrete(args, env, ALGO, CONTINUOUS)
    learners = list(env.groups)  # the learning groups: make_env acts for the frozen ones
    specs = {g: env.groups[g] for g in learners}
    if args.mean_over == "view" and (unplaced := [g for g, s in specs.items() if not s.has_positions]):
        raise ArgumentError(
            f"--mean-over view needs agent positions, and {args.env_id} has none for {unplaced}: use "
            f"--mean-over group (or auto)"
        )
    mfq = MFQ(specs, args).to(device)
    target = copy.deepcopy(mfq)
    optimizer = torch.optim.Adam(mfq.parameters(), lr=args.learning_rate)
    make_greedy = acting(mfq.agents, specs, args, device)  # evaluation: greedy on the previous mean action
    rows = max(args.buffer_size // max(s.n_agents for s in specs.values()), args.num_envs, args.batch_size)
    rb = ReplayBuffer(rows, args.num_envs, replay_fields(specs))
    nets = {"mfq": mfq, "target": target}
    run = Run(args, ALGO, env, nets, {"mfq": optimizer}, rng, make_greedy, network_flags=NETWORK_FLAGS, replay=rb)
    writer, global_step = run.writer, run.global_step
    train_start = global_step + (0 if run.replay_restored else args.learning_starts)  # else the buffer refills
    # what the loop carries from step to step: --resume takes it back from last.pt, with the env's state
    obs, means, pending, losses = run.begin(
        env.reset(), means=zero_means(specs, args.num_envs), pending=None, losses={}
    )
    with run:
        while global_step < args.total_timesteps:
            # ACT: Boltzmann on Q(o, ., the previous step's mean action); the mean of these actions follows
            temperature = linear_schedule(
                args.temperature_start,
                args.temperature_end,
                args.temperature_fraction * args.total_timesteps,
                global_step,
            )
            actions, new_means = act(mfq.agents, specs, obs, means, temperature, rng, device, args)
            # STORE the previous step, now that its next mean action is known (an ended episode's step keeps its own
            # mean action as the next one: the next episode's actions are never paired with it)
            if pending is not None:
                ended = pending.pop("ended")[:, None, None]
                rb.add(
                    **pending, **{f"next_mean_{g}": np.where(ended, pending[f"mean_{g}"], new_means[g]) for g in specs}
                )
            # STEP
            step = env.step(actions)
            global_step += args.num_envs
            pending = transition(specs, obs, actions, new_means, step)
            means = {g: np.where(step.done[:, None, None], 0.0, m).astype(np.float32) for g, m in new_means.items()}
            run.log_episodes(step.episodes, global_step)
            obs = step.next

            # TARGETS and UPDATE: one gradient step per --train-frequency env steps, a soft target update after each
            if global_step > train_start and len(rb) >= args.batch_size:
                for _ in range(crossings(global_step, args.num_envs, args.train_frequency)):
                    losses = update(mfq, target, optimizer, rb, args, device, rng, temperature)
                    soft_update(target, mfq, args.tau)

            # LOG
            if crossings(global_step, args.num_envs, args.log_interval):
                for k, v in losses.items():
                    writer.add_scalar(f"losses/{k}", v, global_step)
                writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
                writer.add_scalar("charts/temperature", temperature, global_step)
            run.step(global_step, loop=dict(means=means, pending=pending, losses=losses))  # EVAL, checkpoints, Ctrl-C
    run.finish()
    env.close()


# --- what the loop calls: the transition declaration and the MF-Q update ---


def replay_fields(specs):
    """One stored env step, declared once: name -> (per-env shape, dtype)."""
    fields = {}
    for g, spec in specs.items():
        A, n = spec.n_agents, spec.action_dim
        fields |= {
            f"obs_{g}": ((A, *spec.obs_shape), np.float32),
            f"next_obs_{g}": ((A, *spec.obs_shape), np.float32),
            f"actions_{g}": ((A,), np.int64),
            f"mean_{g}": ((A, n), np.float32),
            f"next_mean_{g}": ((A, n), np.float32),
            f"rewards_{g}": ((A,), np.float32),
            f"terminated_{g}": ((A,), np.bool_),
            f"agent_mask_{g}": ((A,), np.bool_),
        }
        if spec.has_action_mask:
            fields |= {f"next_avail_{g}": ((A, n), np.bool_)}
    return fields


def transition(specs, obs, actions, means, step):
    """One env step of every learning group, without its next mean action (known after the next step's actions);
    the next observation is the final one where the episode ended."""
    out = {"ended": step.done}
    for g in specs:
        out |= {
            f"obs_{g}": obs.obs[g],
            f"next_obs_{g}": step.final.obs[g],
            f"actions_{g}": actions[g],
            f"mean_{g}": means[g],
            f"rewards_{g}": step.rewards[g],
            f"terminated_{g}": step.terminated[g],
            f"agent_mask_{g}": obs.agent_mask[g],
        }
        if g in step.final.avail_actions:
            out[f"next_avail_{g}"] = step.final.avail_actions[g]
    return out


def update(mfq, target, optimizer, rb, args, device, rng, temperature):
    """One gradient step: y = r + gamma (1 - terminated) v^MF(o', a_mean'), v^MF the Boltzmann expectation of the
    target Q under the online Q's policy; squared error over the living agents."""
    mb = to_torch(rb.sample(args.batch_size, rng), device)
    sq_err, count, q_sum = 0.0, 0.0, 0.0
    for g, agents in mfq.agents.items():
        q = agents(mb[f"obs_{g}"], mb[f"mean_{g}"]).gather(-1, mb[f"actions_{g}"][..., None]).squeeze(-1)
        with torch.no_grad():
            q_next = agents(mb[f"next_obs_{g}"], mb[f"next_mean_{g}"])
            v_next = boltzmann_value(
                q_next,
                target.agents[g](mb[f"next_obs_{g}"], mb[f"next_mean_{g}"]),
                temperature,
                mb.get(f"next_avail_{g}"),
            )
            y = mb[f"rewards_{g}"] + args.gamma * (1.0 - mb[f"terminated_{g}"]) * v_next
        mask = mb[f"agent_mask_{g}"]
        sq_err = sq_err + (F.mse_loss(q, y, reduction="none") * mask).sum()
        count, q_sum = count + mask.sum(), q_sum + (q.detach() * mask).sum()
    n = count.clamp(min=1.0)
    loss = sq_err / n
    check_finite(loss, "the TD loss", "lower --learning-rate or check the reward scale")
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(mfq.parameters(), args.max_grad_norm)
    optimizer.step()
    return dict(td_loss=loss.item(), q_values=(q_sum / n).item())


if __name__ == "__main__":
    cli(Args, main)
