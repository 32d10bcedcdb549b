"""TarMAC, targeted multi-agent communication (Das et al. 2019, arXiv:1810.11187)"""

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

ALGO = "tarmac"


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    # --- TarMAC (the learning groups are one team: one reward, the mean of its agents'), trained by PPO ---
    comm: bool = True
    """exchange messages (--no-comm: every message is zero, the ablation that shows what the messages carry)"""
    hidden_size: int = 64
    """width of the encoders and the GRU"""
    key_size: int = 16
    """width of a message's signature (key) and of the receivers' queries (the paper's 16)"""
    value_size: int = 32
    """width of a message's value (the paper's 32)"""
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


class TarMAC(nn.Module):
    """The team's recurrent policy with targeted communication: each agent's previous hidden state h_j sends a
    message, a signature k_j and a value v_j; each receiver i asks with a query q_i and hears
    c_i = sum_j softmax_j(q_i . k_j / sqrt(d_k)) v_j over the living senders (itself too, as in the paper); then
    h_i = GRU(e(o_i) + C c_i, h_i). One core (keys, queries, values, C and the GRU) for the team; an encoder e and a
    policy head per group (their observations and actions differ); the team's value from the mean hidden state."""

    def __init__(self, specs, args):
        super().__init__()
        H, self.comm_on = args.hidden_size, args.comm
        self.specs, self.n_agents = specs, sum(spec.n_agents for spec in specs.values())
        self.obs_norms = nn.ModuleDict({g: InputNorm(int(np.prod(s.obs_shape))) for g, s in specs.items()})
        self.encoders = nn.ModuleDict({g: nn.Linear(int(np.prod(s.obs_shape)), H) for g, s in specs.items()})
        self.key, self.query = nn.Linear(H, args.key_size), nn.Linear(H, args.key_size)
        self.message = nn.Linear(H, args.value_size)
        self.comm = nn.Linear(args.value_size, H)  # C
        self.cell = nn.GRUCell(H, H)
        self.heads = nn.ModuleDict({g: nn.Linear(H, s.action_dim) for g, s in specs.items()})
        for head in self.heads.values():  # near-uniform first policies
            nn.init.orthogonal_(head.weight, 0.01)
            nn.init.zeros_(head.bias)
        self.logstd = nn.ParameterDict(
            {g: nn.Parameter(torch.zeros(s.action_dim)) for g, s in specs.items() if not s.discrete}
        )
        self.value = nn.Linear(H, 1)
        self.value_norm, self.use_value_norm = RunningNorm(), args.value_norm

    def attention(self, h, alive):
        """Who listens to whom: (B, N, H), (B, N) -> weights (B, N receivers, N senders), each living receiver's
        summing to 1 over the living senders, from the query's and signatures' scaled dot products."""
        scores = self.query(h) @ self.key(h).transpose(1, 2) / self.key.out_features**0.5
        scores = scores.masked_fill(alive[:, None, :] == 0, -torch.inf)  # a dead agent sends nothing
        return torch.softmax(scores, -1).nan_to_num(0.0) * alive[..., None]  # (all senders dead: 0)

    def messages(self, h, alive):  # C c_i, nothing to a dead agent: (B, N, H), (B, N) -> (B, N, H)
        return self.comm(self.attention(h, alive) @ self.message(h)) * alive[..., None]

    def encode(self, obs):  # obs group -> (..., A, *obs_shape) -> e(o) of every agent (..., N, H)
        return torch.cat(
            [self.encoders[g](self.obs_norms[g](o.flatten(-len(self.specs[g].obs_shape)))) for g, o in obs.items()], -2
        )

    def step(self, x, h, alive):
        """One step of every agent: encoded observations x (B, N, H), h (B, N, H), alive (B, N) -> next h (B, N, H)."""
        if self.comm_on:
            x = x + self.messages(h, alive)
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
def act(net, obs, h, device, greedy=False):
    """One step of the team: actions (numpy, what env.step takes), the samples to store (Gaussian samples before
    clipping to the Box), their log-probabilities, the new hidden states h (E, N, H) and the team's value (E,)."""
    o, avail, alive = views(net, obs, device)
    h = net.step(net.encode(o), h, alive)
    actions, taken, logprobs = {}, {}, {}
    for g, d in net.dists(h, avail).items():
        spec = net.specs[g]
        a = d.mode if greedy else d.sample()
        taken[g], logprobs[g] = a.cpu().numpy(), log_prob(spec, d, a).cpu().numpy()
        a = taken[g]
        actions[g] = a if spec.discrete else np.clip(a, spec.action_low, spec.action_high).astype(np.float32)
    return actions, taken, logprobs, h, net.denormalized(net.team_value(h, alive))


def acting(net, args, device, greedy=True) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: from zero hidden states, reset where episodes end (the
    evaluations, and a checkpoint playing a group: `actor`)."""

    def make(num_envs, rng):
        h = torch.zeros(num_envs, net.n_agents, args.hidden_size, device=device)

        def act_fn(obs, done):
            nonlocal h
            h = reset_finished(h, done)
            actions, _, _, h, _ = act(net, obs, h, device, greedy)
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
    net = TarMAC(specs, args).to(device)
    net.load_state_dict(groups_state(ckpt["nets"]["tarmac"], specs, ("obs_norms", "encoders", "heads", "logstd")))
    return acting(net, args, device, greedy)


NETWORK_FLAGS = ("hidden_size", "key_size", "value_size")  # what a checkpoint's weights depend on


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
        (
            min(args.key_size, args.value_size) >= 1,
            f"--key-size {args.key_size} and --value-size {args.value_size} must be >= 1",
        ),
    )
    args.num_iterations = args.total_timesteps // args.batch_size
    device, rng = setup(args)
    env = make_env(args, args.num_envs, args.seed)
    learners = list(env.groups)  # the learning groups: make_env acts for the frozen ones
    specs = {g: env.groups[g] for g in learners}
    net = TarMAC(specs, args).to(device)
    optimizer = adam(net.parameters(), args.learning_rate, eps=1e-5)

    make_greedy = acting(net, args, device)  # evaluation: greedy actions
    run = Run(
        args,
        ALGO,
        env,
        {"tarmac": net},
        {"tarmac": optimizer},
        rng,
        make_greedy,
        network_flags=NETWORK_FLAGS,
        same_flags=("num_steps",),
    )
    writer, global_step, start = run.writer, run.global_step, run.counters.get("iteration", 0) + 1
    rb = RolloutBuffer(args.num_steps, args.num_envs, rollout_fields(specs, net.n_agents, args))
    h = torch.zeros(args.num_envs, net.n_agents, args.hidden_size, device=device)
    obs, starts, h = run.begin(env.reset(), starts=np.ones(args.num_envs, bool), h=h)  # --resume: last.pt's, env's
    with run:
        for iteration in range(start, args.num_iterations + 1):
            lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
            optimizer.param_groups[0]["lr"] = lr

            for _ in range(args.num_steps):
                # ACT: every agent's GRU step on its observation and its message, then its action
                h_before = h.cpu().numpy()  # the training sequences restart from it
                actions, taken, logprobs, h, values = act(net, obs, h, device)
                # STEP
                step = env.step(actions)
                global_step += args.num_envs
                # STORE: the team's step (its reward: the mean of its agents'); a truncated episode bootstraps from
                # V of its final observation, one more GRU step on it
                final_values = act(net, step.final, h, device)[4] if step.truncated.any() else 0 * values
                rb.add(
                    **team_step(obs, taken, step, specs),
                    **{f"logprobs_{g}": lp for g, lp in logprobs.items()},
                    values=values,
                    truncated=step.truncated,
                    final_values=final_values,
                    h=h_before,
                    starts=starts,
                )
                h = reset_finished(h, step.done)  # the next episodes start from zero
                starts = step.done
                run.log_episodes(step.episodes, global_step)
                obs = step.next

            # TARGETS: GAE of the team's TD errors, V(s') of the rollout's last step from one more GRU step
            rb.compute_gae(act(net, obs, h, device)[4], args.gamma, args.gae_lambda, rewards="reward")
            if args.value_norm:
                net.value_norm.update(torch.as_tensor(rb.targets["returns"]).flatten().to(device))
            # UPDATE
            for k, v in update(net, optimizer, rb, args, device, rng).items():
                writer.add_scalar(f"losses/{k}", v, global_step)
            net.update_input_norms(rb)
            rb.reset()

            # LOG, then EVAL and checkpoints (run.step: also where Ctrl-C stops the run, between two updates)
            writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
            writer.add_scalar("charts/learning_rate", lr, global_step)
            run.step(global_step, loop=dict(starts=starts, h=h), iteration=iteration)
    run.finish()
    env.close()


# --- what the loop calls: the rollout declaration and the PPO update through time and messages ---


def rollout_fields(specs, n_agents, args):
    """The team's rollout, declared once: each group's observations, actions (the samples), masks and
    log-probabilities; the team's reward, termination and value; the hidden states each step was acted from and
    where episodes began (the states restart there)."""
    fields = team_fields(specs) | {f"logprobs_{g}": ((s.n_agents,), np.float32) for g, s in specs.items()}
    fields |= {"values": ((), np.float32), "truncated": ((), np.bool_), "final_values": ((), np.float32)}
    return fields | {"h": ((n_agents, args.hidden_size), np.float32), "starts": ((), np.bool_)}


def unroll(net, mb):
    """The rollout's sequences replayed through the GRU and the messages, from their stored first hidden states:
    group -> distributions over (L, B, A) actions, team values (L, B), alive (L, B, N)."""
    alive = torch.cat([mb[f"agent_mask_{g}"] for g in net.specs], 2).float()  # (L, B, N)
    x = net.encode({g: mb[f"obs_{g}"] for g in net.specs})  # (L, B, N, H): every step's inputs at once
    h, hs = mb["h"][0], []
    # one slice of each per step (indexing x[step] would give every step's gradient a zero tensor as large as x)
    for x_t, alive_t, start in zip(x.unbind(0), alive.unbind(0), mb["starts"].unbind(0), strict=True):
        h = h * (1.0 - start.float())[:, None, None]  # an episode began here: from zero
        h = net.step(x_t, h, alive_t)
        hs.append(h)
    hs = torch.stack(hs)  # (L, B, N, H)
    avail = {g: mb[f"avail_{g}"].flatten(0, 1) for g in net.specs if f"avail_{g}" in mb}
    flat = net.dists(hs.flatten(0, 1), avail)
    return flat, net.team_value(hs.flatten(0, 1), alive.flatten(0, 1)).view(alive.shape[:2]), alive


def update(net, opt, rb, args, device, rng):
    """PPO epochs on whole sequences: clipped surrogate of every agent's action with the team's advantage, clipped
    Huber value loss, entropy bonus; dead agents masked out. The gradient flows through time and through the
    messages, from each agent's action into the other agents' encoders and GRU states."""
    clipfracs = []
    norm = net.value_norm.normalize if args.value_norm else (lambda x: x)
    for _ in range(args.update_epochs):
        for mb in rb.sequences(args.num_steps, args.num_minibatches, rng):
            mb = to_torch(mb, device)
            dists, new_v, alive = unroll(net, mb)
            adv = mb["advantages"]  # (L, B): the team's
            if args.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg, ent, masks = [], [], []
            for g, d in dists.items():
                spec = net.specs[g]
                logratio = log_prob(spec, d, mb[f"actions_{g}"].flatten(0, 1)) - mb[f"logprobs_{g}"].flatten(0, 1)
                ratio = logratio.exp()  # (L * B, A)
                a = adv.flatten()[:, None]
                pg.append(torch.max(-a * ratio, -a * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)))
                ent.append(d.entropy() if spec.discrete else d.entropy().sum(-1))
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
