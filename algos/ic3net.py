"""IC3Net, individualized controlled continuous communication (Singh, Jain and Sukhbaatar 2019, arXiv:1812.09755)"""

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Normal

from buffers import RolloutBuffer, float_tensor, team_fields, team_step, to_torch
from runtime import (
    Categorical,
    InputNorm,
    MakePolicy,
    MultiAgentArgs,
    Run,
    RunningNorm,
    adam,
    check_args,
    check_finite,
    checkpoint_args,
    cli,
    clip_grad_norm,
    groups_state,
    make_env,
    reset_finished,
    setup,
)

ALGO = "ic3net"


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    # --- IC3Net (the learning groups are one team: one reward, the mean of its agents'), trained by PPO ---
    comm: bool = True
    """exchange messages (--no-comm: every message is zero and every gate closed, out of the loss: no communication at
    all, the paper's independent baseline; the ablation that shows what the messages carry)"""
    hidden_size: int = 64
    """width of the encoders, the messages and the GRU (IC3Net's CommNet: 64)"""
    learning_rate: float = 7e-4
    """Adam learning rate (mappo.py's)"""
    anneal_lr: bool = False
    """linear learning-rate decay to 0"""
    num_steps: int = 25
    """steps per env per rollout, trained as one sequence from the hidden state it started in"""
    gamma: float = 0.95
    """discount (mappo.py's 0.95 for 25-step MPE episodes)"""
    gae_lambda: float = 0.95
    """GAE lambda (bias-variance trade-off of the advantages)"""
    num_minibatches: int = 1
    """minibatches (of whole env sequences) per update epoch"""
    update_epochs: int = 10
    """passes over each rollout"""
    clip_coef: float = 0.2
    """PPO ratio clip (and value clip) range"""
    ent_coef: float = 0.01
    """entropy bonus weight"""
    vf_coef: float = 1.0
    """value loss weight"""
    max_grad_norm: float = 10.0
    """global gradient-norm clip"""
    norm_adv: bool = True
    """advantage normalization"""
    value_norm: bool = True
    """running mean/std normalization of value targets"""

    # --- derived at runtime ---
    batch_size: int = field(default=0, init=False)
    """num_envs x num_steps"""
    num_iterations: int = field(default=0, init=False)
    """total_timesteps // batch_size"""


class IC3Net(nn.Module):
    """The team's recurrent policy with gated communication (the paper's IC3Net, a GRU for its LSTM): each step,
    agent i's hidden state is h_i = GRU(e(o_i) + C c_i, h_i), where the message c_i is the mean, over the other living
    agents, of the previous hidden states of those whose gate was open, and i hears it only if its own gate was open.
    The gate is a second, binary action of each agent from its hidden state (open: communicate), learned by the same
    policy gradient. One core (C, the GRU, the gate) for the team; an encoder e and a policy head per group (their
    observations and actions differ); the team's value from the mean hidden state."""

    def __init__(self, specs, args):
        super().__init__()
        H, self.comm_on = args.hidden_size, args.comm
        self.specs, self.n_agents = specs, sum(spec.n_agents for spec in specs.values())
        self.obs_norms = nn.ModuleDict({g: InputNorm(int(np.prod(s.obs_shape))) for g, s in specs.items()})
        self.encoders = nn.ModuleDict({g: nn.Linear(int(np.prod(s.obs_shape)), H) for g, s in specs.items()})
        self.comm = nn.Linear(H, H)  # C
        self.cell = nn.GRUCell(H, H)
        self.gate = nn.Linear(H, 2)  # the gate's logits: closed, open
        self.heads = nn.ModuleDict({g: nn.Linear(H, s.action_dim) for g, s in specs.items()})
        for head in self.heads.values():  # near-uniform first policies
            nn.init.orthogonal_(head.weight, 0.01)
            nn.init.zeros_(head.bias)
        self.logstd = nn.ParameterDict(
            {g: nn.Parameter(torch.zeros(s.action_dim)) for g, s in specs.items() if not s.discrete}
        )
        self.value = nn.Linear(H, 1)
        self.value_norm, self.use_value_norm = RunningNorm(), args.value_norm

    def messages(self, h, alive, talk):
        """C c_i, c_i the sum of the hidden states of the other living agents whose gate is open over the number of
        other living agents (IC3Net's average); nothing to a dead agent or one whose gate is closed:
        (B, N, H), (B, N), (B, N) gates -> (B, N, H)."""
        speakers = h * (alive * talk)[..., None]
        others = (alive.sum(1, keepdim=True) - alive).clamp(min=1.0)  # (B, N): how many others are alive
        heard = (speakers.sum(1, keepdim=True) - speakers) / others[..., None]
        return self.comm(heard) * (alive * talk)[..., None]

    def encode(self, obs):  # obs group -> (..., A, *obs_shape) -> e(o) of every agent (..., N, H)
        return torch.cat(
            [self.encoders[g](self.obs_norms[g](o.flatten(-len(self.specs[g].obs_shape)))) for g, o in obs.items()], -2
        )

    def step(self, x, h, alive, talk):
        """One step of every agent: its encoded observation x (B, N, H), h (B, N, H), alive (B, N), the gates of the
        step before (B, N) -> next h (B, N, H)."""
        if self.comm_on:
            x = x + self.messages(h, alive, talk)
        B, N, H = h.shape
        return self.cell(x.reshape(B * N, H), h.reshape(B * N, H)).view(B, N, H)

    def dists(self, h, avail):
        """Each group's action distribution from its agents' hidden states: group -> over (B, A) actions."""
        out, i = {}, 0
        for g, spec in self.specs.items():
            logits = self.heads[g](h[:, i : i + spec.n_agents])
            if spec.discrete:
                out[g] = Categorical(logits, avail.get(g))  # action masks: unavailable actions get zero probability
            else:
                out[g] = Normal(logits, self.logstd[g].exp().expand_as(logits), validate_args=False)
            i += spec.n_agents
        return out

    def gates(self, h):  # (B, N, H) -> the gate's distribution over (B, N) actions: 0 closed, 1 open
        return Categorical(self.gate(h))

    def team_value(self, h, alive):  # (B, N, H), (B, N) -> V in normalized units (B,), from the living agents' mean
        mean = (h * alive[..., None]).sum(1) / alive.sum(1, keepdim=True).clamp(min=1.0)
        return self.value(mean).squeeze(-1)

    def denormalized(self, v):
        return (self.value_norm.denormalize(v) if self.use_value_norm else v).cpu().numpy()

    def update_input_norms(self, rb):  # after the update: the next rollout and its update see the same statistics
        for g, norm in self.obs_norms.items():
            norm.update(rb[f"obs_{g}"], alive=rb[f"agent_mask_{g}"])


def masked_mean(mask, x):
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def log_prob(spec, d, actions):  # of each agent's action (a Gaussian's dimensions summed)
    return d.log_prob(actions) if spec.discrete else d.log_prob(actions).sum(-1)


def views(net, obs, device):
    """An Observation as the network takes it: group -> obs, group -> action masks, alive (B, N)."""
    o = {g: float_tensor(obs.obs[g], device) for g in net.specs}
    avail = {g: torch.as_tensor(obs.avail_actions[g], device=device) for g in net.specs if g in obs.avail_actions}
    return o, avail, float_tensor(np.concatenate([obs.agent_mask[g] for g in net.specs], 1), device)


@torch.no_grad()
def act(net, obs, h, talk, device, greedy=False):
    """One step of the team: actions (numpy, what env.step takes), the samples to store (Gaussian samples before
    clipping to the Box), their log-probabilities, the new hidden states h (E, N, H), the new gates and their
    log-probabilities (E, N) and the team's value (E,). `talk`: the gates of the step before."""
    o, avail, alive = views(net, obs, device)
    h = net.step(net.encode(o), h, alive, talk)
    g_dist = net.gates(h)
    gate = g_dist.mode if greedy else g_dist.sample()
    if not net.comm_on:  # --no-comm: no gate either (an idle action would only add noise to the update)
        gate = torch.zeros_like(gate)
    actions, taken, logprobs = {}, {}, {}
    for g, d in net.dists(h, avail).items():
        spec = net.specs[g]
        a = d.mode if greedy else d.sample()
        taken[g], logprobs[g] = a.cpu().numpy(), log_prob(spec, d, a).cpu().numpy()
        a = taken[g]
        actions[g] = a if spec.discrete else np.clip(a, spec.action_low, spec.action_high).astype(np.float32)
    gates = (gate.float(), g_dist.log_prob(gate).cpu().numpy())
    return actions, taken, logprobs, h, gates, net.denormalized(net.team_value(h, alive))


def acting(net, args, device, greedy=True) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: from zero hidden states, reset where episodes end (the
    evaluations, and a checkpoint playing a group: `actor`)."""

    def make(num_envs, rng):
        h = torch.zeros(num_envs, net.n_agents, args.hidden_size, device=device)
        talk = torch.zeros(num_envs, net.n_agents, device=device)

        def act_fn(obs, done):
            nonlocal h, talk
            h, talk = reset_finished(h, done), reset_finished(talk, done)
            actions, _, _, h, (talk, _), _ = act(net, obs, h, talk, device, greedy)
            return actions

        return act_fn

    return make


def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:
    """Group `group` of a checkpoint as an actor, its agents talking among themselves: --opponent, --self-play,
    results/tournament.py (runtime.opponents)."""
    return team_actor(ckpt, {group: spec}, device, greedy)


def team_actor(ckpt, specs, device, greedy=True) -> MakePolicy:
    """The groups `specs` of a checkpoint as one team talking as in training (runtime.opponents.load_team)."""
    args = checkpoint_args(Args, ckpt["args"])
    net = IC3Net(specs, args).to(device)
    net.load_state_dict(groups_state(ckpt["nets"]["ic3net"], specs, ("obs_norms", "encoders", "heads", "logstd")))
    return acting(net, args, device, greedy)


NETWORK_FLAGS = ("hidden_size",)  # what a checkpoint's weights depend on


def main(args):
    args.batch_size = args.num_envs * args.num_steps
    check_args(
        args,
        (
            args.num_minibatches <= args.num_envs,
            f"--num-minibatches {args.num_minibatches} exceeds --num-envs {args.num_envs} (a minibatch holds whole "
            "env sequences)",
        ),
        (
            args.total_timesteps >= args.batch_size,
            f"--total-timesteps {args.total_timesteps} is less than one rollout "
            f"(--num-envs x --num-steps = {args.batch_size})",
        ),
    )
    args.num_iterations = args.total_timesteps // args.batch_size
    device, rng = setup(args)
    env = make_env(args, args.num_envs, args.seed)
    learners = list(env.groups)  # the learning groups: make_env acts for the frozen ones
    specs = {g: env.groups[g] for g in learners}
    net = IC3Net(specs, args).to(device)
    optimizer = adam(net.parameters(), args.learning_rate, eps=1e-5)

    make_greedy = acting(net, args, device)  # evaluation: greedy actions
    run = Run(
        args,
        ALGO,
        env,
        {"ic3net": net},
        {"ic3net": optimizer},
        rng,
        make_greedy,
        network_flags=NETWORK_FLAGS,
        same_flags=("num_steps",),
    )
    writer, global_step, start = run.writer, run.global_step, run.counters.get("iteration", 0) + 1
    rb = RolloutBuffer(args.num_steps, args.num_envs, rollout_fields(specs, net.n_agents, args))
    h = torch.zeros(args.num_envs, net.n_agents, args.hidden_size, device=device)
    talk = torch.zeros(args.num_envs, net.n_agents, device=device)  # the gates: closed when an episode begins
    obs, starts, h, talk = run.begin(env.reset(), starts=np.ones(args.num_envs, bool), h=h, talk=talk)  # or last.pt's
    with run:
        for iteration in range(start, args.num_iterations + 1):
            lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
            optimizer.param_groups[0]["lr"] = lr

            for _ in range(args.num_steps):
                # ACT: every agent's GRU step on its observation and the messages of the open gates, then its action
                # and its gate for the next step
                h_before, talk_before = h.cpu().numpy(), talk.cpu().numpy()  # the training sequences replay them
                actions, taken, logprobs, h, (talk, gate_logprobs), values = act(net, obs, h, talk, device)
                # STEP
                step = env.step(actions)
                global_step += args.num_envs
                # STORE: the team's step (its reward: the mean of its agents'); a truncated episode bootstraps from
                # V of its final observation, one more GRU step on it
                final_values = act(net, step.final, h, talk, device)[5] if step.truncated.any() else 0 * values
                rb.add(
                    **team_step(obs, taken, step, specs),
                    **{f"logprobs_{g}": lp for g, lp in logprobs.items()},
                    values=values,
                    truncated=step.truncated,
                    final_values=final_values,
                    h=h_before,
                    talk=talk_before,
                    gate=talk.cpu().numpy().astype(np.int64),
                    gate_logprobs=gate_logprobs,
                    starts=starts,
                )
                h = reset_finished(h, step.done)  # the next episodes start from zero, gates closed
                talk = reset_finished(talk, step.done)
                starts = step.done
                run.log_episodes(step.episodes, global_step)
                obs = step.next

            # TARGETS: GAE of the team's TD errors, V(s') of the rollout's last step from one more GRU step
            rb.compute_gae(act(net, obs, h, talk, device)[5], args.gamma, args.gae_lambda, rewards="reward")
            if args.value_norm:
                net.value_norm.update(torch.as_tensor(rb.targets["returns"]).flatten().to(device))
            # UPDATE
            for k, v in update(net, optimizer, rb, args, device, rng).items():
                writer.add_scalar(f"losses/{k}", v, global_step)
            writer.add_scalar("charts/open_gates", float(rb["gate"].mean()), global_step)  # how much they talk
            net.update_input_norms(rb)
            rb.reset()

            # LOG, then EVAL and checkpoints (run.step: also where Ctrl-C stops the run, between two updates)
            writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
            writer.add_scalar("charts/learning_rate", lr, global_step)
            run.step(global_step, loop=dict(starts=starts, h=h, talk=talk), iteration=iteration)
    run.finish()
    env.close()


# --- what the loop calls: the rollout declaration and the PPO update through time and messages ---


def rollout_fields(specs, n_agents, args):
    """The team's rollout, declared once: each group's observations, actions (the samples), masks and
    log-probabilities; every agent's gate and its log-probability; the team's reward, termination and value; the
    hidden states and gates each step was acted from, and where episodes began (the states restart there)."""
    fields = team_fields(specs) | {f"logprobs_{g}": ((s.n_agents,), np.float32) for g, s in specs.items()}
    fields |= {"values": ((), np.float32), "truncated": ((), np.bool_), "final_values": ((), np.float32)}
    fields |= {"gate": ((n_agents,), np.int64), "gate_logprobs": ((n_agents,), np.float32)}
    return fields | {
        "h": ((n_agents, args.hidden_size), np.float32),
        "talk": ((n_agents,), np.float32),
        "starts": ((), np.bool_),
    }


def unroll(net, mb):
    """The rollout's sequences replayed through the GRU and the messages, from their stored first hidden states:
    group -> distributions over (L, B, A) actions, the gates' over (L * B, N), team values (L, B), alive (L, B, N)."""
    alive = torch.cat([mb[f"agent_mask_{g}"] for g in net.specs], 2).float()  # (L, B, N)
    x = net.encode({g: mb[f"obs_{g}"] for g in net.specs})  # (L, B, N, H): every step's inputs at once
    h, hs = mb["h"][0], []
    # one slice of each per step (indexing x[step] would give every step's gradient a zero tensor as large as x)
    for x_t, alive_t, start, talk_t in zip(
        x.unbind(0), alive.unbind(0), mb["starts"].unbind(0), mb["talk"].unbind(0), strict=True
    ):
        h = h * (1.0 - start.float())[:, None, None]  # an episode began here: from zero
        h = net.step(x_t, h, alive_t, talk_t)
        hs.append(h)
    hs = torch.stack(hs)  # (L, B, N, H)
    avail = {g: mb[f"avail_{g}"].flatten(0, 1) for g in net.specs if f"avail_{g}" in mb}
    flat = net.dists(hs.flatten(0, 1), avail)
    values = net.team_value(hs.flatten(0, 1), alive.flatten(0, 1)).view(alive.shape[:2])
    return flat, net.gates(hs.flatten(0, 1)), values, alive


def update(net, opt, rb, args, device, rng):
    """PPO epochs on whole sequences: clipped surrogate of every agent's joint action (its action and its gate: the
    ratios multiply) with the team's advantage, clipped Huber value loss, entropy bonus of both; dead agents masked
    out. The gradient flows through time and through the messages, from each agent's action into the other agents'
    encoders and GRU states; the gate learns by the policy gradient alone (its choice is discrete)."""
    clipfracs = []
    norm = net.value_norm.normalize if args.value_norm else (lambda x: x)
    for _ in range(args.update_epochs):
        for mb in rb.sequences(args.num_steps, args.num_minibatches, rng):
            mb = to_torch(mb, device)
            dists, gates, new_v, alive = unroll(net, mb)
            gate_logratio = gates.log_prob(mb["gate"].flatten(0, 1)) - mb["gate_logprobs"].flatten(0, 1)  # (L * B, N)
            gate_entropy = gates.entropy()
            if not net.comm_on:  # --no-comm: the gates, held closed, are no part of the joint action
                gate_logratio, gate_entropy = torch.zeros_like(gate_logratio), torch.zeros_like(gate_entropy)
            adv = mb["advantages"]  # (L, B): the team's
            if args.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg, ent, masks, i = [], [], [], 0
            for g, d in dists.items():
                spec = net.specs[g]
                logratio = log_prob(spec, d, mb[f"actions_{g}"].flatten(0, 1)) - mb[f"logprobs_{g}"].flatten(0, 1)
                logratio = logratio + gate_logratio[:, i : i + spec.n_agents]
                ratio = logratio.exp()  # (L * B, A)
                a = adv.flatten()[:, None]
                pg.append(torch.max(-a * ratio, -a * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)))
                ent.append(
                    (d.entropy() if spec.discrete else d.entropy().sum(-1)) + gate_entropy[:, i : i + spec.n_agents]
                )
                i += spec.n_agents
                masks.append(mb[f"agent_mask_{g}"].flatten(0, 1).float())
                with torch.no_grad():
                    clipfracs.append(masked_mean(masks[-1], ((ratio - 1.0).abs() > args.clip_coef).float()).item())
            mask = torch.cat(masks, 1)  # death masking: a dead agent's steps weigh nothing
            pg_loss, entropy = masked_mean(mask, torch.cat(pg, 1)), masked_mean(mask, torch.cat(ent, 1))
            target, old_v = norm(mb["returns"]), norm(mb["values"])
            err = torch.max(
                (target - new_v).abs(), (target - old_v - (new_v - old_v).clamp(-args.clip_coef, args.clip_coef)).abs()
            )
            v_loss = torch.where(err < 10.0, 0.5 * err**2, 10.0 * (err - 5.0)).mean()  # Huber, delta 10 (mappo.py's)
            loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
            check_finite(loss, "the loss", "lower --learning-rate or --max-grad-norm", policy=pg_loss, value=v_loss)
            opt.zero_grad()
            loss.backward()
            clip_grad_norm(list(net.parameters()), args.max_grad_norm)
            opt.step()
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
