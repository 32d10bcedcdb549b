"""MF-AC, mean-field actor-critic (Yang et al. 2018, arXiv:1802.05438)"""

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical

from buffers import RolloutBuffer, float_tensor, to_torch
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
    make_env,
    setup,
    sub_state,
)

ALGO = "mfac"
CONTINUOUS = "mappo.py, ippo.py, maddpg.py, matd3.py or iddpg.py"  # the scripts for continuous actions


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    num_envs: int = 16
    """parallel training envs"""

    # --- MF-AC (an actor pi(a|o) and a critic of the neighbours' mean action, shared by a group's agents) ---
    mean_over: Literal["auto", "view", "group"] = "auto"
    """the neighbours whose actions are averaged: 'view' (the agents within --view-radius, on grid envs),
    'group' (every other living agent of the group), or 'auto' (view where the env has positions, else group)"""
    view_radius: float = 6.0
    """--mean-over view: the neighbourhood's radius in cells (MAgent2 battle's view range is a circle of 6)"""
    learning_rate: float = 1e-4
    """Adam learning rate of actor and critic (the authors' battle setting)"""
    num_steps: int = 25
    """steps per env per rollout"""
    gamma: float = 0.95
    """discount"""
    td_lambda: float = 0.95
    """lambda of the critic's TD(lambda) targets"""
    ent_coef: float = 0.08
    """entropy bonus weight (the authors' battle setting)"""
    vf_coef: float = 0.1
    """critic loss weight (the authors' battle setting, where actor and critic share layers; here they share none, and
    under Adam the weight moves the critic's steps only through --max-grad-norm's clip)"""
    max_grad_norm: float = 5.0
    """gradient-norm clip, of actor and critic separately"""
    hidden_size: int = 64
    """width of the actor, of the critic's observation and mean-action encoders, and of its head"""
    critic: Literal["v", "q"] = "v"
    """'v': the authors' code's critic (mlii/mfrl, algo/ac.py), a state value V(o, a_mean) and the advantage
    returns - V; 'q': the paper's equations, Q(o, a, a_mean) and the advantage Q(o, a, a_mean) - sum_a' pi(a'|o) Q(o,
    a', a_mean) (it fails the one-agent simple_v3: results/mpe_matrix.md)"""

    BEFORE_FLAGS: ClassVar[dict] = {"critic": "q"}
    """not a flag: what a checkpoint written before --critic existed ran with (runtime.checkpoint_args)"""

    # --- derived at runtime ---
    batch_size: int = field(default=0, init=False)
    """num_envs x num_steps"""
    num_iterations: int = field(default=0, init=False)
    """total_timesteps // batch_size"""


class Agents(nn.Module):
    """One group's actor pi(.|o) and mean-field critic V(o, a_mean) (--critic q: Q(o, ., a_mean)), shared by its
    agents."""

    def __init__(self, spec, args):
        super().__init__()
        h, n, d = args.hidden_size, spec.action_dim, int(np.prod(spec.obs_shape))
        self.obs_dims = len(spec.obs_shape)
        self.actor = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, n))
        self.critic_obs = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU())
        self.critic_mean = nn.Sequential(nn.Linear(n, h), nn.ReLU())
        self.critic_head = nn.Sequential(nn.Linear(2 * h, h), nn.ReLU(), nn.Linear(h, n if args.critic == "q" else 1))

    def policy(self, obs, avail=None):  # obs (..., A, *obs_shape) -> Categorical over (..., A)
        logits = self.actor(obs.flatten(obs.dim() - self.obs_dims))
        logits = logits if avail is None else logits.masked_fill(avail == 0, -1e9)
        return Categorical(logits=logits, validate_args=False)

    def q(self, obs, mean):  # -> Q(o, ., a_mean) (..., A, n), or V(o, a_mean) (..., A, 1) with --critic v
        x = self.critic_obs(obs.flatten(mean.dim() - 1))
        return self.critic_head(torch.cat([x, self.critic_mean(mean)], -1))

    def v(self, obs, mean, avail=None):  # -> V(o, a_mean) (..., A): the critic's own, or sum_a pi(a|o) Q(o, a, a_mean)
        q = self.q(obs, mean)
        return q.squeeze(-1) if q.shape[-1] == 1 else (self.policy(obs, avail).probs * q).sum(-1)


class MFAC(nn.Module):
    """One Agents per learning group."""

    def __init__(self, specs, args):
        super().__init__()
        self.agents = nn.ModuleDict({g: Agents(spec, args) for g, spec in specs.items()})


def masked_mean(mask, x):
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def mean_actions(obs, g, actions, n, args):
    """The neighbours' mean one-hot action of every agent of group g (E, A, n), by the compiled kernel."""
    radius = args.view_radius if g in obs.positions and args.mean_over != "group" else None
    return neighbour_mean_actions(obs.positions.get(g), obs.agent_mask[g], actions, n, radius)


@torch.no_grad()
def act(agents, specs, obs, device, args, greedy=False):
    """Every group's actions (a sample of pi, or its mode) and the neighbours' mean of them."""
    actions, means = {}, {}
    for g, spec in specs.items():
        avail = obs.avail_actions.get(g)
        d = agents[g].policy(float_tensor(obs.obs[g], device), None if avail is None else float_tensor(avail, device))
        actions[g] = (d.probs.argmax(-1) if greedy else d.sample()).cpu().numpy()
        means[g] = mean_actions(obs, g, actions[g], spec.action_dim, args)
    return actions, means


@torch.no_grad()
def value(agents, obs, mean, device, avail=None):
    """V(o, a_mean), numpy (E, A)."""
    return (
        agents.v(
            float_tensor(obs, device),
            float_tensor(mean, device),
            None if avail is None else float_tensor(avail, device),
        )
        .cpu()
        .numpy()
    )


def acting(agents, specs, args, device, greedy=True) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: the mode of pi, or samples of it if not greedy (the evaluations,
    and a checkpoint playing a group: `actor`)."""
    return lambda num_envs, rng: lambda obs, done: act(agents, specs, obs, device, args, greedy)[0]


def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:
    """Group `group` of a checkpoint as an actor: --opponent, --self-play, results/tournament.py (runtime.opponents)."""
    args = checkpoint_args(Args, ckpt["args"])
    agents = nn.ModuleDict({group: Agents(spec, args)}).to(device)
    agents[group].load_state_dict(sub_state(ckpt["nets"]["mfac"], f"agents.{group}."))
    return acting(agents, {group: spec}, args, device, greedy)


NETWORK_FLAGS = ("hidden_size", "critic")  # what the weights depend on


def main(args):
    args.batch_size = args.num_envs * args.num_steps
    check_args(
        args,
        (args.view_radius >= 0, f"--view-radius {args.view_radius} must be >= 0"),
        (
            args.total_timesteps >= args.batch_size,
            f"--total-timesteps {args.total_timesteps} is less than one "
            f"rollout (--num-envs x --num-steps = {args.batch_size})",
        ),
    )
    args.num_iterations = args.total_timesteps // args.batch_size
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
    mfac = MFAC(specs, args).to(device)
    optimizer = torch.optim.Adam(mfac.parameters(), lr=args.learning_rate)
    make_greedy = acting(mfac.agents, specs, args, device)  # evaluation: the most probable action
    run = Run(
        args,
        ALGO,
        env,
        {"mfac": mfac},
        {"mfac": optimizer},
        rng,
        make_greedy,
        network_flags=NETWORK_FLAGS,
        same_flags=("num_steps",),
    )
    writer, global_step, start = run.writer, run.global_step, run.counters.get("iteration", 0) + 1
    buffers = {g: RolloutBuffer(args.num_steps, args.num_envs, rollout_fields(spec)) for g, spec in specs.items()}
    last_means = {g: np.zeros((args.num_envs, s.n_agents, s.action_dim), np.float32) for g, s in specs.items()}
    obs, last_means = run.begin(env.reset(), last_means=last_means)  # --resume: from last.pt, with the env
    with run:
        for iteration in range(start, args.num_iterations + 1):
            for _ in range(args.num_steps):
                # ACT: a ~ pi(.|o); the critic sees the neighbours' mean of these actions
                actions, means = act(mfac.agents, specs, obs, device, args)
                values = {
                    g: value(mfac.agents[g], obs.obs[g], means[g], device, obs.avail_actions.get(g)) for g in specs
                }
                # STEP
                step = env.step(actions)
                global_step += args.num_envs
                # STORE: a truncated episode bootstraps from V(final observation), at the step's own mean action
                # (no action is taken there: the next episode's actions are never paired with it)
                for g in specs:
                    f = step.final
                    final = (
                        value(mfac.agents[g], f.obs[g], means[g], device, f.avail_actions.get(g))
                        if (step.truncated.any())
                        else 0 * values[g]
                    )
                    avail = {"avail": obs.avail_actions[g]} if g in obs.avail_actions else {}
                    buffers[g].add(
                        obs=obs.obs[g],
                        actions=actions[g],
                        mean=means[g],
                        values=values[g],
                        rewards=step.rewards[g],
                        terminated=step.terminated[g],
                        truncated=step.truncated,
                        final_values=final,
                        alive=obs.agent_mask[g],
                        **avail,
                    )
                done = step.done[:, None, None]
                last_means = {g: np.where(done, 0.0, m).astype(np.float32) for g, m in means.items()}
                run.log_episodes(step.episodes, global_step)
                obs = step.next

            # TARGETS: TD(lambda) returns of V(o', a_mean') by the compiled kernel (the rollout's last observation:
            # at its env's last mean action), then the UPDATE, group by group
            for g, rb in buffers.items():
                rb.compute_td_lambda(
                    value(mfac.agents[g], obs.obs[g], last_means[g], device, obs.avail_actions.get(g)),
                    args.gamma,
                    args.td_lambda,
                )
                for k, v in update(mfac.agents[g], optimizer, rb, args, device, rng).items():
                    writer.add_scalar(f"losses/{k}" if len(specs) == 1 else f"losses/{k}/{g}", v, global_step)
                rb.reset()

            # LOG, then EVAL and checkpoints (run.step: also where Ctrl-C stops the run, between two updates)
            writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
            run.step(global_step, loop=dict(last_means=last_means), iteration=iteration)
    run.finish()
    env.close()


# --- what the loop calls: the rollout declaration and the MF-AC update ---


def rollout_fields(spec):
    """One group's rollout, declared once: name -> (per-env shape, dtype)."""
    A, n = spec.n_agents, spec.action_dim
    fields = {
        "obs": ((A, *spec.obs_shape), np.float32),
        "actions": ((A,), np.int64),
        "mean": ((A, n), np.float32),
        "values": ((A,), np.float32),
        "rewards": ((A,), np.float32),
        "terminated": ((A,), np.bool_),
        "truncated": ((), np.bool_),
        "final_values": ((A,), np.float32),
        "alive": ((A,), np.bool_),
    }
    if spec.has_action_mask:
        fields["avail"] = ((A, n), np.bool_)
    return fields


def update(agents, optimizer, rb, args, device, rng):
    """One actor-critic step on the whole rollout: the actor follows A = Q(o, a, a_mean) - V(o, a_mean) (--critic v:
    returns - V(o, a_mean)), the critic regresses Q(o, a, a_mean) (or V) on the TD(lambda) returns; dead agents' steps
    weigh nothing."""
    mb = to_torch(next(rb.minibatches(1, rng)), device)  # the whole rollout as one flat batch
    mask = mb["alive"]
    d = agents.policy(mb["obs"], mb.get("avail"))
    q_all = agents.q(mb["obs"], mb["mean"])
    if args.critic == "q":
        q = q_all.gather(-1, mb["actions"][..., None]).squeeze(-1)
        advantage = (q - (d.probs * q_all).sum(-1)).detach()
    else:
        q = q_all.squeeze(-1)  # V(o, a_mean)
        advantage = (mb["returns"] - q).detach()
    pg_loss = masked_mean(mask, -d.log_prob(mb["actions"]) * advantage)
    v_loss = masked_mean(mask, 0.5 * (q - mb["returns"]) ** 2)
    entropy = masked_mean(mask, d.entropy())
    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
    check_finite(loss, "the loss", "lower --learning-rate", policy=pg_loss, value=v_loss)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agents.actor.parameters(), args.max_grad_norm)
    critic = [p for m in (agents.critic_obs, agents.critic_mean, agents.critic_head) for p in m.parameters()]
    nn.utils.clip_grad_norm_(critic, args.max_grad_norm)
    optimizer.step()
    return dict(
        policy_loss=pg_loss.item(),
        value_loss=v_loss.item(),
        entropy=entropy.item(),
        advantage=masked_mean(mask, advantage.abs()).item(),
    )


if __name__ == "__main__":
    cli(Args, main)
