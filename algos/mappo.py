"""MAPPO (Yu et al. 2022, arXiv:2103.01955); results: results/simple_spread_v3/mappo.json"""

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Normal

from buffers import RolloutBuffer, float_tensor, to_torch
from runtime import (
    Categorical,
    GroupLinear,
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
    fast_acting,
    feature_norm,
    gru_sequence,
    make_env,
    mlp_forward,
    per_agent,
    reset_finished,
    setup,
)

ALGO = "mappo"


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    # --- MAPPO (defaults: the MAPPO paper's MPE settings) ---
    learning_rate: float = 7e-4
    """Adam learning rate of actor and critic (the MAPPO paper's MPE value)"""
    anneal_lr: bool = False
    """linear learning-rate decay to 0 (off, like the MAPPO paper's code: it cuts off slow learners such as
    simple_reference's communication, results/mpe_matrix.md)"""
    num_steps: int = 25
    """steps per env per rollout"""
    gamma: float = 0.95
    """discount; 0.95 for 25-step MPE episodes (the paper's 0.99 learned slower: results/simple_spread_v3/tuning.md)"""
    gae_lambda: float = 0.95
    """GAE lambda (bias-variance trade-off of the advantages)"""
    num_minibatches: int = 1
    """minibatches per update epoch"""
    update_epochs: int = 10
    """passes over each rollout"""
    clip_coef: float = 0.2
    """PPO ratio clip (and value clip) range"""
    ent_coef: float = 0.01
    """entropy bonus weight"""
    vf_coef: float = 1.0
    """value loss weight"""
    max_grad_norm: float = 10.0
    """gradient-norm clip, of actor and critic separately"""
    norm_adv: bool = True
    """advantage normalization"""
    clip_vloss: bool = True
    """value clipping around the old prediction"""
    huber_delta: float = 10.0
    """Huber value loss with this delta (0: squared error)"""
    value_norm: bool = True
    """running mean/std normalization of value targets"""
    ortho_init: bool = True
    """orthogonal initialization"""
    feature_norm: Literal["running", "layer", "none"] = "running"
    """the actor's and critic's inputs: normalized per feature by running mean/std, fixed within a rollout; `layer`:
    the MAPPO paper's input LayerNorm, which discards each observation's scale (results/mpe_matrix.md)"""
    rnn: bool = False
    """a GRU cell in place of the second hidden layer of actor and critic (recurrent MAPPO)"""
    rnn_chunk: int = 25
    """--rnn: steps per training sequence (divides --num-steps); each starts from the stored hidden state"""
    hidden_size: int = 64
    """width of the hidden layers (and of the GRU with --rnn)"""
    share_params: bool = True
    """one network per group with an agent-id one-hot (--no-share-params: one network per agent)"""

    # --- derived at runtime ---
    batch_size: int = field(default=0, init=False)
    """num_envs x num_steps"""
    num_iterations: int = field(default=0, init=False)
    """total_timesteps // batch_size"""


def layer_init(layer, std=2**0.5, ortho=True):  # orthogonal weights, one matrix per agent (else torch's default)
    for w in layer.weight.data:
        nn.init.orthogonal_(w, std) if ortho else nn.init.kaiming_uniform_(w.T, a=5**0.5)
    return layer  # biases stay zero


class GroupGRU(nn.Module):
    """A GRU cell per agent (n=1: shared) on (B, A, h) inputs and hidden states."""

    def __init__(self, n, h, ortho=True):
        super().__init__()
        self.x2g = layer_init(GroupLinear(n, h, 3 * h), 1.0, ortho)
        self.h2g = layer_init(GroupLinear(n, h, 3 * h), 1.0, ortho)

    def forward(self, x, hx, keep=None):  # keep (L, N): x holds N sequences of L steps (time-major), hx their start
        if keep is not None:  # every step's state: the input gates in one product, the recurrence in one call
            gx = per_agent(self.x2g, x).unflatten(0, keep.shape)
            return gru_sequence(gx, hx, *self.h2g.parameters(), keep).flatten(0, 1)
        xr, xz, xn = per_agent(self.x2g, x).chunk(3, -1)
        hr, hz, hn = per_agent(self.h2g, hx).chunk(3, -1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        return (1 - z) * torch.tanh(xn + r * hn) + z * hx


class Net(nn.Module):
    """[LayerNorm] -> Linear -> ReLU -> Linear -> ReLU (--rnn: a GRU cell) -> Linear, on (B, A, d_in): the one
    definition of the network, which Policy.forward_net's two fast paths compute too."""

    def __init__(self, n, d_in, d_out, args, out_std):
        super().__init__()
        h, o = args.hidden_size, args.ortho_init
        self.norm = nn.LayerNorm(d_in) if feature_norm(args) == "layer" else nn.Identity()
        self.fc = layer_init(GroupLinear(n, d_in, h), ortho=o)
        self.mid = GroupGRU(n, h, o) if args.rnn else layer_init(GroupLinear(n, h, h), ortho=o)
        self.head = layer_init(GroupLinear(n, h, d_out), out_std, o)

    def forward(self, x, hx=None, keep=None):  # -> (B, A, d_out) and the next hidden state (None without --rnn)
        return self.trunk(per_agent(self.fc, self.norm(x)), hx, keep)

    def trunk(self, x, hx=None, keep=None):  # the rest, from the first layer's output (B, A, h)
        x = torch.relu(x)
        if hx is None:
            return per_agent(self.head, torch.relu(per_agent(self.mid, x))), None
        hs = self.mid(x, hx, keep)  # one step, or with keep (L, N) all L*N (the next state: the last N)
        return per_agent(self.head, hs), hs[-len(hx) :]


class Policy(nn.Module):
    """One group's decentralized actor (own observation) and centralized critic (global state)."""

    def __init__(self, spec, state_dim, args):
        super().__init__()
        self.spec, self.with_id = spec, args.share_params and spec.n_agents > 1
        self.register_buffer("ids", torch.eye(spec.n_agents), persistent=False)  # the agent-id one-hots
        n, ids = (1 if args.share_params else spec.n_agents), (spec.n_agents if self.with_id else 0)
        obs_dim = int(np.prod(spec.obs_shape))
        self.actor = Net(n, obs_dim + ids, spec.action_dim, args, out_std=0.01)
        self.critic = Net(n, state_dim + ids, 1, args, out_std=1.0)
        if not spec.discrete:  # state-independent log-std
            self.logstd = nn.Parameter(torch.zeros(spec.action_dim))
        self.value_norm, self.use_value_norm = RunningNorm(), args.value_norm
        on = feature_norm(args) == "running"  # per-feature input statistics: an observation keeps its scale and offset
        self.obs_norm, self.state_norm = InputNorm(obs_dim, on), InputNorm(state_dim, on)

    def update_input_norms(self, rb):  # after the update: the next rollout and its update see the same statistics
        self.obs_norm.update(rb["obs"], alive=rb["agent_mask"])
        self.state_norm.update(rb["state"])

    def _with_id(self, x):  # append a one-hot agent id so a shared network can tell agents apart
        return torch.cat([x, self.ids.expand(*x.shape[:-1], -1)], -1) if self.with_id else x

    def forward_net(self, net, x, norm, hx=None, keep=None):
        """`net` (actor or critic) on inputs x (B, A, d), or on a state x (B, S) that every agent sees, normalized by
        `norm`, with the agents' ids: Net, or where they serve its two fast paths, each held equal to it by a test.
        Acting: the whole pass in one compiled call (runtime/mlp.py; test_the_compiled_acting_pass_equals_the_modules
        in tests/test_mlp.py). A state with ids: its part of the first layer once, not per agent (state_id_layer;
        test_critic_takes_the_state_once_and_equals_the_per_agent_input in tests/test_mappo.py)."""
        A = self.spec.n_agents
        if hx is None and fast_acting(x, net):
            return mlp_forward(net, x, norm, self.with_id, A), None
        x = norm(x)
        if x.dim() == 2 and self.with_id:
            return net.trunk(state_id_layer(net, x, A), hx, keep)
        if x.dim() == 2:
            x = x.unsqueeze(1).expand(-1, A, -1)
        return net(self._with_id(x), hx, keep)

    def actor_out(self, obs, hx=None, keep=None):  # obs (B, A, *obs_shape) -> (logits or means, next hidden state)
        return self.forward_net(self.actor, obs.flatten(2), self.obs_norm, hx, keep)

    def dist(self, out, avail=None):  # actor outputs (..., A, action_dim) -> a distribution over (..., A) actions
        if not self.spec.discrete:
            return Normal(out, self.logstd.exp().expand_as(out), validate_args=False)  # checks cost ~10% of acting
        return Categorical(out, avail)  # action masks (avail): unavailable actions get zero probability

    def critic_values(self, state, hx=None, keep=None):  # (B, *S) -> normalized V per agent (B, A), next hidden
        v, hx = self.forward_net(self.critic, state.flatten(1), self.state_norm, hx, keep)
        return v.squeeze(-1), hx

    def value(self, state, hx=None):  # V in return units (numpy) and the next hidden state
        v, hx = self.critic_values(state, hx)
        return (self.value_norm.denormalize(v) if self.use_value_norm else v).cpu().numpy(), hx

    def log_prob(self, d, actions):  # of each agent's action (a Gaussian's dimensions summed)
        return d.log_prob(actions) if self.spec.discrete else d.log_prob(actions).sum(-1)

    def entropy(self, d):
        return d.entropy() if self.spec.discrete else d.entropy().sum(-1)


def masked_mean(mask, x):
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def initial_hidden(policies, args, num_envs, device):  # group -> zero hidden states (None without --rnn)
    return {
        g: torch.zeros(num_envs, p.spec.n_agents, args.hidden_size, device=device) if args.rnn else None
        for g, p in policies.items()
    }


def act(policies, obs, device, hidden, greedy=False):
    """Actions of every group (numpy, what env.step takes) and what the buffer stores: the sampled actions
    (Gaussian samples before clipping to the Box) and their log-probabilities. `hidden` is advanced in place."""
    actions, taken = {}, {}
    for g, pol in policies.items():
        spec, avail = pol.spec, obs.avail_actions.get(g)
        out, hidden[g] = pol.actor_out(float_tensor(obs.obs[g], device), hidden[g])
        d = pol.dist(out, None if avail is None else float_tensor(avail, device))
        a = d.mode if greedy else d.sample()
        taken[g] = {"actions": a.cpu().numpy(), "logprobs": pol.log_prob(d, a).cpu().numpy()}
        a = taken[g]["actions"]  # the log-probability belongs to the sample: only the env sees it clipped
        actions[g] = a if spec.discrete else np.clip(a, spec.action_low, spec.action_high).astype(np.float32)
    return actions, taken


def acting(policies, args, device, greedy=True) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: the policies from zero hidden states, reset where episodes end
    (the evaluations, and a checkpoint playing a group: `actor`)."""

    def make(num_envs, rng):
        hidden = initial_hidden(policies, args, num_envs, device)

        def act_fn(obs, done):
            nonlocal hidden
            hidden = reset_finished(hidden, done)
            return act(policies, obs, device, hidden, greedy)[0]

        return act_fn

    return make


def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:
    """Group `group` of a checkpoint as an actor: --opponent, --self-play, results/tournament.py (runtime.opponents)."""
    args = checkpoint_args(Args, ckpt["args"])
    pol = Policy(spec, int(np.prod(ckpt["signature"]["state_shape"])), args).to(device)
    pol.load_state_dict(ckpt["nets"][group])
    return acting({group: pol}, args, device, greedy)


NETWORK_FLAGS = ("hidden_size", "share_params", "feature_norm", "rnn")  # what a checkpoint's weights depend on


def main(args):
    args.batch_size = args.num_envs * args.num_steps
    check_args(
        args,
        (
            args.num_minibatches <= args.batch_size,
            f"--num-minibatches {args.num_minibatches} exceeds "
            f"the rollout's {args.batch_size} env steps (--num-envs x --num-steps)",
        ),
        (
            not args.rnn or args.rnn_chunk < 1 or args.num_steps % args.rnn_chunk == 0,
            f"--rnn-chunk {args.rnn_chunk} must divide --num-steps {args.num_steps}",
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
    learners = list(env.groups)  # the learning groups: make_env acts for the frozen ones
    state_dim = int(np.prod(env.state_shape))
    policies = {g: Policy(spec, state_dim, args).to(device) for g, spec in env.groups.items()}
    optimizers = {g: adam(policies[g].parameters(), args.learning_rate, eps=1e-5) for g in learners}

    make_greedy = acting(policies, args, device)  # evaluation: greedy actions
    run = Run(
        args, ALGO, env, policies, optimizers, rng, make_greedy, network_flags=NETWORK_FLAGS, same_flags=("num_steps",)
    )
    writer, global_step, start = run.writer, run.global_step, run.counters.get("iteration", 0) + 1
    buffers = {
        g: RolloutBuffer(args.num_steps, args.num_envs, rollout_fields(env.groups[g], env.state_shape, args))
        for g in learners
    }
    h_actor = initial_hidden(policies, args, args.num_envs, device)  # --rnn: group -> (E, A, H), else None
    h_critic = initial_hidden(policies, args, args.num_envs, device)
    obs, starts, h_actor, h_critic = run.begin(  # what the loop carries (--resume: from last.pt, with the env)
        env.reset(), starts=np.ones(args.num_envs, bool), h_actor=h_actor, h_critic=h_critic
    )
    with run:
        for iteration in range(start, args.num_iterations + 1):
            lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
            for g in learners:
                optimizers[g].param_groups[0]["lr"] = lr

            for _ in range(args.num_steps):
                # ACT (recurrent: the hidden states acted on are stored with it), in inference mode (no autograd)
                with torch.inference_mode():
                    stored = {
                        g: {
                            "h_actor": h_actor[g].cpu().numpy(),
                            "h_critic": h_critic[g].cpu().numpy(),
                            "starts": starts,
                        }
                        if args.rnn
                        else {}
                        for g in learners
                    }
                    actions, taken = act(policies, obs, device, h_actor)
                    state, values = float_tensor(obs.state, device), {}
                    for g in learners:
                        values[g], h_critic[g] = policies[g].value(state, h_critic[g])
                # STEP
                step = env.step(actions)
                global_step += args.num_envs
                # STORE: a truncated episode bootstraps from V(final observation), not the next episode's first
                with torch.inference_mode():
                    final = float_tensor(step.final.state, device) if step.truncated.any() else None
                    final_values = {
                        g: policies[g].value(final, h_critic[g])[0] if final is not None else 0 * values[g]
                        for g in learners
                    }
                for g in learners:
                    avail = {"avail_actions": obs.avail_actions[g]} if g in obs.avail_actions else {}
                    buffers[g].add(
                        obs=obs.obs[g],
                        state=obs.state,
                        **taken[g],
                        values=values[g],
                        rewards=step.rewards[g],
                        terminated=step.terminated[g],
                        truncated=step.truncated,
                        final_values=final_values[g],
                        agent_mask=obs.agent_mask[g],
                        **avail,
                        **stored[g],
                    )
                h_actor = reset_finished(h_actor, step.done)  # the next episodes start from zero
                h_critic = reset_finished(h_critic, step.done)
                starts = step.done
                run.log_episodes(step.episodes, global_step)
                obs = step.next

            # TARGETS and UPDATE, group by group
            for g in learners:
                pol, rb = policies[g], buffers[g]
                with torch.no_grad():
                    last_values = pol.value(float_tensor(obs.state, device), h_critic[g])[0]
                rb.compute_gae(last_values, args.gamma, args.gae_lambda)
                if args.value_norm:
                    alive = torch.as_tensor(rb["agent_mask"])
                    pol.value_norm.update(torch.as_tensor(rb.targets["returns"])[alive].to(device))
                for k, v in update(pol, optimizers[g], rb, args, device, rng).items():
                    writer.add_scalar(f"losses/{k}" if len(learners) == 1 else f"losses/{k}/{g}", v, global_step)
                pol.update_input_norms(rb)
                rb.reset()

            # LOG, then EVAL and checkpoints (run.step: also where Ctrl-C stops the run, between two updates)
            writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
            writer.add_scalar("charts/learning_rate", lr, global_step)
            run.step(global_step, loop=dict(starts=starts, h_actor=h_actor, h_critic=h_critic), iteration=iteration)
    run.finish()
    env.close()


# --- what the loop calls: the rollout declaration and the PPO update ---


def rollout_fields(spec, state_shape, args):
    """One group's rollout, declared once: name -> (per-env shape, dtype)."""
    A = spec.n_agents
    fields = {
        "obs": ((A, *spec.obs_shape), np.float32),
        "state": (state_shape, np.float32),
        "actions": ((A,), np.int64) if spec.discrete else ((A, spec.action_dim), np.float32),
        "logprobs": ((A,), np.float32),
        "values": ((A,), np.float32),
        "rewards": ((A,), np.float32),
        "terminated": ((A,), np.bool_),
        "truncated": ((), np.bool_),
        "final_values": ((A,), np.float32),  # V(final observation) where an episode was truncated
        "agent_mask": ((A,), np.bool_),
    }
    if spec.has_action_mask:
        fields["avail_actions"] = ((A, spec.action_dim), np.bool_)
    if args.rnn:  # the hidden states each step was acted on, and where episodes began (the states restart)
        H = args.hidden_size
        fields |= {"h_actor": ((A, H), np.float32), "h_critic": ((A, H), np.float32), "starts": ((), np.bool_)}
    return fields


def state_id_layer(critic, s, A):  # (B, S) -> the critic's first layer on [s, one-hot id] of A agents (B, A, h)
    """The state's part is every agent's, the id's is one weight row; LayerNorm's mean and variance are alike."""
    S, D, norm = s.shape[1], s.shape[1] + A, critic.norm
    (w_s, w_id), b = critic.fc.weight[0].split([S, A]), critic.fc.bias[0]  # one network: n = 1
    if isinstance(norm, nn.Identity):
        return (s @ w_s + b).unsqueeze(1) + w_id
    mean = (s.sum(1, keepdim=True) + 1) / D  # (B, 1)
    inv = torch.rsqrt(((s - mean).square().sum(1, keepdim=True) + (1 - mean) ** 2 + (A - 1) * mean**2) / D + norm.eps)
    (g_s, g_id), (b_s, b_id) = norm.weight.split([S, A]), norm.bias.split([S, A])
    shared = ((s - mean) * inv * g_s + b_s) @ w_s + (-mean * inv * g_id + b_id) @ w_id + b  # (B, h)
    return shared.unsqueeze(1) + inv.unsqueeze(-1) * (g_id.unsqueeze(1) * w_id)  # + agent a's id: row a


def forward_batch(pol, mb, args):
    """Actor outputs and normalized values of a minibatch: flat samples, or --rnn chunks (L, N, ...) unrolled."""
    if not args.rnn:
        return pol.actor_out(mb["obs"])[0], pol.critic_values(mb["state"])[0]
    keep, steps = 1 - mb["starts"], mb["starts"].shape  # (L, N): the hidden states restart where an episode began
    out = pol.actor_out(mb["obs"].flatten(0, 1), mb["h_actor"][0], keep)[0]
    values = pol.critic_values(mb["state"].flatten(0, 1), mb["h_critic"][0], keep)[0]
    return out.unflatten(0, steps), values.unflatten(0, steps)


def update(pol, opt, rb, args, device, rng):
    """PPO epochs: clipped surrogate, clipped Huber value loss, entropy bonus; dead agents masked out."""
    clipfracs = []
    norm = pol.value_norm.normalize if args.value_norm else (lambda x: x)
    for _ in range(args.update_epochs):
        batches = (
            rb.sequences(args.rnn_chunk, args.num_minibatches, rng)
            if args.rnn
            else rb.minibatches(args.num_minibatches, rng)
        )
        for mb in batches:
            mb = to_torch(mb, device)
            mask = mb["agent_mask"]  # death masking: a dead agent's steps weigh nothing in any loss
            out, new_v = forward_batch(pol, mb, args)  # new_v in normalized units, like the targets below
            dist = pol.dist(out, mb.get("avail_actions"))
            logprob, entropy = pol.log_prob(dist, mb["actions"]), pol.entropy(dist)
            logratio = logprob - mb["logprobs"]
            ratio = logratio.exp()
            with torch.no_grad():
                approx_kl = masked_mean(mask, (ratio - 1) - logratio)
                clipfracs.append(masked_mean(mask, ((ratio - 1.0).abs() > args.clip_coef).float()).item())
            adv = mb["advantages"]
            if args.norm_adv:
                mean = masked_mean(mask, adv)
                adv = (adv - mean) / (masked_mean(mask, (adv - mean) ** 2).sqrt() + 1e-8)
            clipped_ratio = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
            pg_loss = masked_mean(mask, torch.max(-adv * ratio, -adv * clipped_ratio))

            target, old_v = norm(mb["returns"]), norm(mb["values"])
            err = (target - new_v).abs()
            if args.clip_vloss:
                # the error of a value moved at most --clip-coef from the one acted with
                clipped_err = (target - old_v - (new_v - old_v).clamp(-args.clip_coef, args.clip_coef)).abs()
                err = torch.max(err, clipped_err)
            delta = args.huber_delta
            if delta > 0:  # Huber: squared below delta, linear above it
                huber = torch.where(err < delta, 0.5 * err**2, delta * (err - 0.5 * delta))
            else:
                huber = 0.5 * err**2
            v_loss = masked_mean(mask, huber)
            ent = masked_mean(mask, entropy)
            loss = pg_loss - args.ent_coef * ent + args.vf_coef * v_loss
            check_finite(
                loss,
                f"group {pol.spec.name}: the loss",
                "lower --learning-rate or --max-grad-norm, or check the rewards",
                policy=pg_loss,
                value=v_loss,
            )
            opt.zero_grad()
            loss.backward()
            clip_grad_norm(pol.actor.parameters(), args.max_grad_norm)
            clip_grad_norm(pol.critic.parameters(), args.max_grad_norm)
            opt.step()
    ret, val = rb.targets["returns"], rb["values"]
    explained_var = 0.0 if np.var(ret) == 0 else float(1 - np.var(ret - val) / np.var(ret))
    return dict(
        policy_loss=pg_loss.item(),
        value_loss=v_loss.item(),
        entropy=ent.item(),
        approx_kl=approx_kl.item(),
        clipfrac=float(np.mean(clipfracs)),
        explained_variance=explained_var,
    )


if __name__ == "__main__":
    cli(Args, main)
