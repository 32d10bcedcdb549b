"""VDAC-sum and VDAC-mix (Su et al. 2021, arXiv:2007.12306); results: results/simple_spread_v3/vdac.json"""

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical

from buffers import RolloutBuffer, float_tensor, team_fields, team_step, to_torch
from runtime import (
    InputNorm,
    MakePolicy,
    MultiAgentArgs,
    Run,
    adam,
    check_args,
    check_discrete,
    check_finite,
    checkpoint_args,
    cli,
    make_env,
    setup,
    sub_state,
)

ALGO = "vdac"
CONTINUOUS = "mappo.py, ippo.py, maddpg.py, matd3.py or iddpg.py"  # the scripts for continuous actions


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    # --- VDAC (the learning groups form one team; its reward is the mean of its agents' rewards) ---
    mixer: Literal["sum", "mix"] = "mix"
    """'sum' (VDAC-sum: V_tot = sum of the local V_a) or 'mix' (VDAC-mix: a monotonic mix conditioned on the state)"""
    learning_rate: float = 7e-4
    """Adam learning rate of actors, local critics and mixer"""
    anneal_lr: bool = False
    """linear learning-rate decay to 0 (off, like VDAC's own code and mappo.py: equal or better on every cooperative
    MPE task without it, results/mpe_matrix.md)"""
    num_steps: int = 25
    """steps per env per rollout"""
    gamma: float = 0.95
    """discount; 0.95 for 25-step MPE episodes, as in mappo.py"""
    gae_lambda: float = 0.95
    """GAE lambda of the team advantage"""
    update_epochs: int = 10
    """passes over each rollout (1: the paper's single actor-critic step, where the ratio clip changes nothing)"""
    num_minibatches: int = 1
    """minibatches per pass"""
    clip_coef: float = 0.2
    """PPO's ratio clip of the policy loss, which keeps several passes near the acting policy"""
    ent_coef: float = 0.01
    """entropy bonus weight"""
    vf_coef: float = 1.0
    """weight of the V_tot loss"""
    max_grad_norm: float = 10.0
    """gradient-norm clip of actors and critics separately"""
    norm_adv: bool = True
    """advantage normalization"""
    hidden_size: int = 64
    """width of the actors' and local critics' hidden layers"""
    feature_norm: Literal["running", "none"] = "running"
    """`running`: the networks' inputs (observations, and the mixer's state) normalized per feature by running
    mean/std, fixed within a rollout, as mappo.py's default; `none` was the default before, and VDAC failed on
    simple_reference without it (results/mpe_matrix.md)"""
    mixing_embed_dim: int = 32
    """--mixer mix: width of the mixing network's hidden layer"""
    hypernet_embed: int = 64
    """--mixer mix: width of the hypernetworks' hidden layer"""

    BEFORE_FLAGS: ClassVar[dict] = {"feature_norm": "none"}
    """not a flag: what a checkpoint written before --feature-norm existed ran with (runtime.checkpoint_args)"""

    # --- derived at runtime ---
    batch_size: int = field(default=0, init=False)
    """num_envs x num_steps"""
    num_iterations: int = field(default=0, init=False)
    """total_timesteps // batch_size"""


def mlp(d_in, d_out, h, out_std):
    """Linear-ReLU-Linear-ReLU-Linear with orthogonal initialization."""
    layers = [nn.Linear(d_in, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, d_out)]
    for layer, std in zip(layers[::2], (2**0.5, 2**0.5, out_std), strict=True):
        nn.init.orthogonal_(layer.weight, std)
        nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class Agents(nn.Module):
    """One group's decentralized actor pi(a | o) and local critic V_a(o), each shared by its agents (with an id)."""

    def __init__(self, spec, args):
        super().__init__()
        obs_dim = int(np.prod(spec.obs_shape))
        self.spec, d = spec, obs_dim + spec.n_agents
        self.actor = mlp(d, spec.action_dim, args.hidden_size, 0.01)
        self.critic = mlp(d, 1, args.hidden_size, 1.0)
        self.obs_norm = InputNorm(obs_dim, args.feature_norm == "running")
        self.register_buffer("ids", torch.eye(spec.n_agents), persistent=False)  # the agent-id one-hots

    def forward(self, obs):  # obs (B, A, *obs_shape) -> logits (B, A, n), local values (B, A)
        x = self.obs_norm(obs.flatten(2))
        x = torch.cat([x, self.ids.expand(*x.shape[:-1], -1)], -1)
        return self.actor(x), self.critic(x).squeeze(-1)


class Mixer(nn.Module):
    """V_tot = w2 . elu(W1 v + b1) + V(s), with W1, w2 >= 0 from hypernetworks on the state: dV_tot/dV_a >= 0."""

    def __init__(self, n_agents, state_dim, args):
        super().__init__()
        e, h = args.mixing_embed_dim, args.hypernet_embed
        self.hyper_w1 = nn.Sequential(nn.Linear(state_dim, h), nn.ReLU(), nn.Linear(h, n_agents * e))
        self.hyper_b1 = nn.Linear(state_dim, e)
        self.hyper_w2 = nn.Sequential(nn.Linear(state_dim, h), nn.ReLU(), nn.Linear(h, e))
        self.v = nn.Sequential(nn.Linear(state_dim, e), nn.ReLU(), nn.Linear(e, 1))

    def forward(self, values, state):  # values (B, N) local values, state (B, S) -> V_tot (B,)
        B, N = values.shape
        w1 = self.hyper_w1(state).abs().view(B, N, -1)  # abs: the monotonicity constraint
        hidden = F.elu((values.unsqueeze(1) @ w1).squeeze(1) + self.hyper_b1(state))
        return (hidden * self.hyper_w2(state).abs()).sum(-1) + self.v(state).squeeze(-1)


class VDAC(nn.Module):
    """The team: one Agents per learning group, and V_tot from all their local values (a sum, or the mixer)."""

    def __init__(self, specs, state_dim, args):
        super().__init__()
        self.agents = nn.ModuleDict({g: Agents(spec, args) for g, spec in specs.items()})
        n_agents = sum(spec.n_agents for spec in specs.values())
        self.mixer = Mixer(n_agents, state_dim, args) if args.mixer == "mix" else None
        self.state_norm = InputNorm(state_dim, args.feature_norm == "running" and self.mixer is not None)

    def v_tot(self, local_values, state, alive):  # local (B, N), state (B, *S), alive (B, N) -> V_tot (B,)
        local_values = local_values * alive  # a dead agent adds nothing
        if self.mixer is None:
            return local_values.sum(-1)
        return self.mixer(local_values, self.state_norm(state.flatten(1)))

    def update_input_norms(self, rb):  # after the update: the next rollout and its update see the same statistics
        for g, agents in self.agents.items():
            agents.obs_norm.update(rb[f"obs_{g}"], alive=rb[f"agent_mask_{g}"])
        self.state_norm.update(rb["state"])


def dist(logits, avail=None):  # action masks: unavailable actions get zero probability
    return Categorical(logits=logits if avail is None else logits.masked_fill(avail == 0, -1e9), validate_args=False)


@torch.no_grad()
def act(vdac, obs, device, greedy=False):
    """Actions of every group (numpy), their log-probabilities, and V_tot of the team (E,)."""
    actions, logprobs, local = {}, {}, []
    for g, agents in vdac.agents.items():
        a, logprobs[g], v = group_act(agents, obs, g, device, greedy)
        actions[g] = a.cpu().numpy()
        local.append(v)
    logprobs = {g: lp.cpu().numpy() for g, lp in logprobs.items()}
    alive = float_tensor(np.concatenate([obs.agent_mask[g] for g in vdac.agents], 1), device)
    return actions, logprobs, vdac.v_tot(torch.cat(local, -1), float_tensor(obs.state, device), alive).cpu().numpy()


def group_act(agents, obs, g, device, greedy=False):
    """Group g's actions, their log-probabilities and the agents' local values (torch)."""
    avail = obs.avail_actions.get(g)
    logits, v = agents(float_tensor(obs.obs[g], device))
    d = dist(logits, None if avail is None else float_tensor(avail, device))
    a = d.probs.argmax(-1) if greedy else d.sample()
    return a, d.log_prob(a), v


def acting(agents, device, greedy=True) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: every group's most probable action, or samples if not greedy
    (the evaluations, and a checkpoint playing a group: `actor`); `agents`: group -> Agents."""
    act_fn = torch.no_grad()(
        lambda obs, done: {g: group_act(a, obs, g, device, greedy)[0].cpu().numpy() for g, a in agents.items()}
    )
    return lambda num_envs, rng: act_fn


def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:
    """Group `group` of a checkpoint as an actor: --opponent, --self-play, results/tournament.py (runtime.opponents)."""
    agents = Agents(spec, checkpoint_args(Args, ckpt["args"])).to(device)
    agents.load_state_dict(sub_state(ckpt["nets"]["vdac"], f"agents.{group}."))
    return acting({group: agents}, device, greedy)


NETWORK_FLAGS = ("hidden_size", "mixer", "mixing_embed_dim", "hypernet_embed", "feature_norm")  # the weights' flags


def main(args):
    args.batch_size = args.num_envs * args.num_steps
    check_args(
        args,
        (
            args.num_minibatches <= args.batch_size,
            f"--num-minibatches {args.num_minibatches} exceeds the "
            f"rollout's {args.batch_size} env steps (--num-envs x --num-steps)",
        ),
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
    vdac = VDAC(specs, int(np.prod(env.state_shape)), args).to(device)
    optimizer = adam(vdac.parameters(), args.learning_rate, eps=1e-5)

    make_greedy = acting(vdac.agents, device)  # evaluation: the most probable action of every agent
    run = Run(
        args,
        ALGO,
        env,
        {"vdac": vdac},
        {"vdac": optimizer},
        rng,
        make_greedy,
        network_flags=NETWORK_FLAGS,
        same_flags=("num_steps",),
    )
    writer, global_step, start = run.writer, run.global_step, run.counters.get("iteration", 0) + 1
    rb = RolloutBuffer(args.num_steps, args.num_envs, rollout_fields(specs, env.state_shape))
    [obs] = run.begin(env.reset())  # --resume: the env's state at last.pt
    with run:
        for iteration in range(start, args.num_iterations + 1):
            lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
            optimizer.param_groups[0]["lr"] = lr

            for _ in range(args.num_steps):
                # ACT
                actions, logprobs, values = act(vdac, obs, device)
                # STEP
                step = env.step(actions)
                global_step += args.num_envs
                # STORE: a truncated episode bootstraps from V_tot(final observation), not the next episode's first
                final_values = act(vdac, step.final, device)[2] if (step.truncated.any()) else np.zeros_like(values)
                rb.add(
                    **team_step(obs, actions, step, specs, state=True),
                    **{f"logprobs_{g}": lp for g, lp in logprobs.items()},
                    truncated=step.truncated,
                    values=values,
                    final_values=final_values,
                )
                run.log_episodes(step.episodes, global_step)
                obs = step.next

            # TARGETS: GAE of the team's TD errors r + gamma V_tot(s') - V_tot(s), by the compiled kernel
            rb.compute_gae(act(vdac, obs, device)[2], args.gamma, args.gae_lambda, rewards="reward")
            # UPDATE
            for k, v in update(vdac, optimizer, rb, specs, args, device, rng).items():
                writer.add_scalar(f"losses/{k}", v, global_step)
            vdac.update_input_norms(rb)
            rb.reset()

            # LOG, then EVAL and checkpoints (run.step: also where Ctrl-C stops the run, between two updates)
            writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
            writer.add_scalar("charts/learning_rate", lr, global_step)
            run.step(global_step, loop={}, iteration=iteration)
    run.finish()
    env.close()


# --- what the loop calls: two small helpers, the rollout declaration and the VDAC update ---


def masked_mean(mask, x):
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def rollout_fields(specs, state_shape):
    """The team's rollout, declared once: each group's observations, actions, masks and log-probabilities; the state,
    the team's reward (the mean over its agents) and termination (all of them), V_tot(s_t), and V_tot of the final
    observation where an episode was truncated."""
    fields = team_fields(specs, state_shape) | {f"logprobs_{g}": ((s.n_agents,), np.float32) for g, s in specs.items()}
    return fields | {"truncated": ((), np.bool_), "values": ((), np.float32), "final_values": ((), np.float32)}


def update(vdac, optimizer, rb, specs, args, device, rng):
    """Actor-critic epochs: every agent's policy follows the team advantage; V_tot regresses on the GAE returns."""
    clipfracs = []
    for _ in range(args.update_epochs):
        for mb in rb.minibatches(args.num_minibatches, rng):
            mb = to_torch(mb, device)
            adv = mb["advantages"]  # (B,): one team advantage, credited to each agent through its own policy
            if args.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_losses, entropies, masks, local = [], [], [], []
            for g, agents in vdac.agents.items():
                logits, v = agents(mb[f"obs_{g}"])
                d = dist(logits, mb.get(f"avail_{g}"))
                # the policy gradient with the team advantage; on the first pass ratio = 1 (A2C's gradient), then
                # PPO's pessimistic clip keeps the later passes near the acting policy
                ratio = (d.log_prob(mb[f"actions_{g}"]) - mb[f"logprobs_{g}"]).exp()
                clipped = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
                pg_losses.append(-torch.min(ratio * adv[:, None], clipped * adv[:, None]))
                clipfracs.append(((ratio - 1).abs() > args.clip_coef).float().mean().item())
                entropies.append(d.entropy())
                masks.append(mb[f"agent_mask_{g}"])
                local.append(v)
            mask = torch.cat(masks, -1)  # (B, N): dead agents' steps weigh nothing
            pg_loss = masked_mean(mask, torch.cat(pg_losses, -1))
            entropy = masked_mean(mask, torch.cat(entropies, -1))
            v_tot = vdac.v_tot(torch.cat(local, -1), mb["state"], mask)
            v_loss = 0.5 * ((v_tot - mb["returns"]) ** 2).mean()
            loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
            check_finite(loss, "the loss", "lower --learning-rate", policy=pg_loss, value=v_loss)
            optimizer.zero_grad()
            loss.backward()
            for agents in vdac.agents.values():
                nn.utils.clip_grad_norm_(agents.actor.parameters(), args.max_grad_norm)
            critics = [p for a in vdac.agents.values() for p in a.critic.parameters()]
            nn.utils.clip_grad_norm_(
                critics + ([] if vdac.mixer is None else list(vdac.mixer.parameters())), args.max_grad_norm
            )
            optimizer.step()
    ret, val = rb.targets["returns"], rb["values"]
    explained_var = 0.0 if np.var(ret) == 0 else float(1 - np.var(ret - val) / np.var(ret))
    return dict(
        policy_loss=pg_loss.item(),
        value_loss=v_loss.item(),
        entropy=entropy.item(),
        clipfrac=float(np.mean(clipfracs)),
        explained_variance=explained_var,
    )


if __name__ == "__main__":
    cli(Args, main)
