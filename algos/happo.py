"""HAPPO, heterogeneous-agent PPO (Zhong et al. 2024, JMLR, arXiv:2304.09870)"""

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
    make_env,
    setup,
    sub_state,
)

ALGO = "happo"


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    # --- HAPPO (the learning groups are one team: one reward, the mean of its agents'; one critic V(s)) ---
    learning_rate: float = 7e-4
    """Adam learning rate of the actors and the critic (mappo.py's, so that the two differ in the update alone)"""
    anneal_lr: bool = False
    """linear learning-rate decay to 0"""
    num_steps: int = 25
    """steps per env per rollout"""
    gamma: float = 0.95
    """discount (mappo.py's 0.95 for 25-step MPE episodes)"""
    gae_lambda: float = 0.95
    """GAE lambda (bias-variance trade-off of the advantages)"""
    num_minibatches: int = 1
    """minibatches per update epoch, of each agent's update and of the critic's"""
    update_epochs: int = 10
    """passes over each rollout, of each agent's update and of the critic's"""
    clip_coef: float = 0.2
    """PPO ratio clip (and value clip) range"""
    ent_coef: float = 0.01
    """entropy bonus weight"""
    max_grad_norm: float = 10.0
    """gradient-norm clip of each actor and of the critic"""
    norm_adv: bool = True
    """advantage normalization (over the rollout's steps where the agent is alive)"""
    clip_vloss: bool = True
    """value clipping around the old prediction"""
    huber_delta: float = 10.0
    """Huber value loss with this delta (0: squared error)"""
    value_norm: bool = True
    """running mean/std normalization of value targets"""
    hidden_size: int = 64
    """width of the hidden layers"""
    share_params: bool = False
    """one actor for the group, with an agent-id one-hot, still updated agent after agent (the paper's theory, and
    its default, is one actor per agent: --no-share-params)"""
    fixed_order: bool = False
    """update the agents in their index order every iteration (default: a new random order, as the paper)"""
    sequential: bool = True
    """each agent on the advantage weighted by its predecessors' ratios (the paper); --no-sequential: every agent on
    the plain advantage, as if all were updated at once (MAPPO's update on HAPPO's actors, critic and reward: the
    ablation of the sequential correction)"""

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


class Actor(nn.Module):
    """pi_i(a | o): a network's logits, or a Gaussian's means with a state-independent log-std."""

    def __init__(self, d_in, spec, args):
        super().__init__()
        self.net = mlp(d_in, spec.action_dim, args.hidden_size, 0.01)
        self.logstd = None if spec.discrete else nn.Parameter(torch.zeros(spec.action_dim))

    def dist(self, x, avail=None):  # (..., d_in) -> a distribution over (...) actions
        out = self.net(x)
        if self.logstd is None:
            return Categorical(out, avail)  # action masks (avail): unavailable actions get zero probability
        return Normal(out, self.logstd.exp().expand_as(out), validate_args=False)


class GroupActors(nn.Module):
    """One group's actors on their own observations: one per agent, or one shared with agent-id one-hots."""

    def __init__(self, spec, args):
        super().__init__()
        A, obs_dim = spec.n_agents, int(np.prod(spec.obs_shape))
        self.spec, self.with_id = spec, args.share_params and A > 1
        self.register_buffer("ids", torch.eye(A), persistent=False)  # the agent-id one-hots
        d_in = obs_dim + (A if self.with_id else 0)
        self.actors = nn.ModuleList(Actor(d_in, spec, args) for _ in range(1 if args.share_params else A))
        self.obs_norm = InputNorm(obs_dim)

    def actor_of(self, i):  # agent i's actor (the shared one with --share-params)
        return self.actors[0 if len(self.actors) == 1 else i]

    def dist(self, obs, i, avail=None):  # obs (B, A, *obs_shape) -> agent i's distribution over (B,) actions
        x = self.obs_norm(obs[:, i].flatten(1))
        if self.with_id:
            x = torch.cat([x, self.ids[i].expand(len(x), -1)], -1)
        return self.actor_of(i).dist(x, None if avail is None else avail[:, i])

    def log_prob(self, d, actions):  # of each sample's action (a Gaussian's dimensions summed)
        return d.log_prob(actions) if self.spec.discrete else d.log_prob(actions).sum(-1)


class Team(nn.Module):
    """The learning groups as one team: their agents' actors, and the centralized critic V(s) of the team's reward
    (the mean of its agents' rewards)."""

    def __init__(self, specs, state_dim, args):
        super().__init__()
        self.groups = nn.ModuleDict({g: GroupActors(spec, args) for g, spec in specs.items()})
        self.agents = [(g, i) for g, spec in specs.items() for i in range(spec.n_agents)]  # all, in index order
        self.critic = mlp(state_dim, 1, args.hidden_size, 1.0)
        self.value_norm, self.use_value_norm = RunningNorm(), args.value_norm
        self.state_norm = InputNorm(state_dim)

    def critic_value(self, state):  # (B, *S) -> V(s) in normalized units (B,)
        return self.critic(self.state_norm(state.flatten(1))).squeeze(-1)

    def value(self, state):  # V(s) in return units (numpy)
        v = self.critic_value(state)
        return (self.value_norm.denormalize(v) if self.use_value_norm else v).cpu().numpy()

    def update_input_norms(self, rb):  # after the update: the next rollout and its update see the same statistics
        for g, actors in self.groups.items():
            actors.obs_norm.update(rb[f"obs_{g}"], alive=rb[f"agent_mask_{g}"])
        self.state_norm.update(rb["state"])


def masked_mean(mask, x):
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


@torch.no_grad()
def act(groups, obs, device, greedy=False):
    """Actions of every group (numpy, what env.step takes), the samples to store (Gaussian samples before clipping
    to the Box) and their log-probabilities (E, A)."""
    actions, taken, logprobs = {}, {}, {}
    for g, actors in groups.items():
        spec, o, avail = actors.spec, float_tensor(obs.obs[g], device), obs.avail_actions.get(g)
        avail = None if avail is None else float_tensor(avail, device)
        samples, logps = [], []
        for i in range(spec.n_agents):
            d = actors.dist(o, i, avail)
            a = d.mode if greedy else d.sample()
            samples.append(a)
            logps.append(actors.log_prob(d, a))
        taken[g], logprobs[g] = torch.stack(samples, 1).cpu().numpy(), torch.stack(logps, 1).cpu().numpy()
        a = taken[g]
        actions[g] = a if spec.discrete else np.clip(a, spec.action_low, spec.action_high).astype(np.float32)
    return actions, taken, logprobs


def acting(groups, device, greedy=True) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions` (the evaluations, and a checkpoint playing a group: `actor`)."""
    return lambda num_envs, rng: lambda obs, done: act(groups, obs, device, greedy)[0]


def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:
    """Group `group` of a checkpoint as an actor: --opponent, --self-play, results/tournament.py (runtime.opponents)."""
    actors = GroupActors(spec, checkpoint_args(Args, ckpt["args"])).to(device)
    actors.load_state_dict(sub_state(ckpt["nets"]["happo"], f"groups.{group}."))
    return acting({group: actors}, device, greedy)


NETWORK_FLAGS = ("hidden_size", "share_params")  # what a checkpoint's weights depend on


def main(args):
    args.batch_size = args.num_envs * args.num_steps
    check_args(
        args,
        (
            args.num_minibatches <= args.batch_size,
            f"--num-minibatches {args.num_minibatches} exceeds the rollout's {args.batch_size} env steps "
            "(--num-envs x --num-steps)",
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
    team = Team(specs, int(np.prod(env.state_shape)), args).to(device)
    optimizers = {"critic": adam(team.critic.parameters(), args.learning_rate, eps=1e-5)}
    for g, actors in team.groups.items():  # one per actor: an agent's update moves nothing of another's
        for i, a in enumerate(actors.actors):
            optimizers[f"{g}.{i}"] = adam(a.parameters(), args.learning_rate, eps=1e-5)

    make_greedy = acting(team.groups, device)  # evaluation: greedy actions
    run = Run(
        args,
        ALGO,
        env,
        {"happo": team},
        optimizers,
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
            for opt in optimizers.values():
                opt.param_groups[0]["lr"] = lr

            for _ in range(args.num_steps):
                # ACT, in inference mode (no autograd)
                with torch.inference_mode():
                    actions, taken, logprobs = act(team.groups, obs, device)
                    values = team.value(float_tensor(obs.state, device))
                # STEP
                step = env.step(actions)
                global_step += args.num_envs
                # STORE: the team's step (its reward: the mean of its agents'); a truncated episode bootstraps from
                # V(final state), not from the next episode's first
                with torch.inference_mode():
                    final_values = (
                        team.value(float_tensor(step.final.state, device)) if step.truncated.any() else 0 * values
                    )
                rb.add(
                    **team_step(obs, taken, step, specs, state=True),
                    **{f"logprobs_{g}": lp for g, lp in logprobs.items()},
                    values=values,
                    truncated=step.truncated,
                    final_values=final_values,
                )
                run.log_episodes(step.episodes, global_step)
                obs = step.next

            # TARGETS: GAE of the team's TD errors, by the compiled kernel
            with torch.no_grad():
                last_values = team.value(float_tensor(obs.state, device))
            rb.compute_gae(last_values, args.gamma, args.gae_lambda, rewards="reward")
            if args.value_norm:
                team.value_norm.update(torch.as_tensor(rb.targets["returns"]).flatten().to(device))
            # UPDATE: the agents one after another in a random order, each on the advantage weighted by M, the
            # product of the ratios of the agents updated before it (1 with --no-sequential); then the critic
            order = range(len(team.agents)) if args.fixed_order else rng.permutation(len(team.agents))
            rb.targets["factor"] = np.ones_like(rb["values"])  # M, per sample
            for k in order:
                g, i = team.agents[k]
                opt = optimizers[f"{g}.{0 if args.share_params else i}"]
                losses = update_agent(team.groups[g], g, i, opt, rb, args, device, rng)
            for k, v in (losses | update_critic(team, optimizers["critic"], rb, args, device, rng)).items():
                writer.add_scalar(f"losses/{k}", v, global_step)
            team.update_input_norms(rb)
            rb.reset()

            # LOG, then EVAL and checkpoints (run.step: also where Ctrl-C stops the run, between two updates)
            writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
            writer.add_scalar("charts/learning_rate", lr, global_step)
            run.step(global_step, loop={}, iteration=iteration)
    run.finish()
    env.close()


# --- what the loop calls: the rollout declaration, an agent's update and the critic's ---


def rollout_fields(specs, state_shape):
    """The team's rollout, declared once: each group's observations, actions (the samples), alive and action masks
    and log-probabilities; the state, and the team's reward, termination and values V(s)."""
    fields = team_fields(specs, state_shape) | {f"logprobs_{g}": ((s.n_agents,), np.float32) for g, s in specs.items()}
    return fields | {"values": ((), np.float32), "truncated": ((), np.bool_), "final_values": ((), np.float32)}


def update_agent(actors, g, i, opt, rb, args, device, rng):
    """Agent i of group g: PPO epochs on M * A(s, a), M the product of pi_new / pi_old of the agents updated before it
    this iteration (the paper's Algorithm 1 and Eq. 11), so that each agent improves the joint policy given its
    predecessors' new policies. Then M takes agent i's own ratio, for the next agent."""
    clipfracs = []
    for _ in range(args.update_epochs):
        for mb in rb.minibatches(args.num_minibatches, rng):
            mb = to_torch(mb, device)
            mask = mb[f"agent_mask_{g}"][:, i]  # death masking: a dead agent's steps weigh nothing
            d = actors.dist(mb[f"obs_{g}"], i, mb.get(f"avail_{g}"))
            logratio = actors.log_prob(d, mb[f"actions_{g}"][:, i]) - mb[f"logprobs_{g}"][:, i]
            ratio = logratio.exp()
            with torch.no_grad():
                approx_kl = masked_mean(mask, (ratio - 1) - logratio)
                clipfracs.append(masked_mean(mask, ((ratio - 1.0).abs() > args.clip_coef).float()).item())
            adv = mb["advantages"]
            if args.norm_adv:
                mean = masked_mean(mask, adv)
                adv = (adv - mean) / (masked_mean(mask, (adv - mean) ** 2).sqrt() + 1e-8)
            clipped_ratio = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
            pg_loss = masked_mean(mask, mb["factor"] * torch.max(-adv * ratio, -adv * clipped_ratio))
            entropy = masked_mean(mask, d.entropy() if actors.spec.discrete else d.entropy().sum(-1))
            loss = pg_loss - args.ent_coef * entropy
            check_finite(
                loss,
                f"group {g}, agent {i}: the policy loss",
                "lower --learning-rate or --max-grad-norm, or check the rewards",
            )
            opt.zero_grad()
            loss.backward()
            clip_grad_norm(actors.actor_of(i).parameters(), args.max_grad_norm)
            opt.step()
    if args.sequential:  # M *= agent i's new ratio on the whole rollout (1 where it was dead: it acted on nothing)
        with torch.no_grad():  # (--no-sequential: M stays 1, no agent's update is seen by the next)
            flat = {k: torch.as_tensor(rb[f"{k}_{g}"], device=device).flatten(0, 1) for k in ("obs", "actions")}
            avail = torch.as_tensor(rb[f"avail_{g}"], device=device).flatten(0, 1) if f"avail_{g}" in rb.data else None
            new = actors.log_prob(actors.dist(flat["obs"], i, avail), flat["actions"][:, i]).cpu().numpy()
            ratio = np.exp(new.reshape(rb["values"].shape) - rb[f"logprobs_{g}"][..., i])
            rb.targets["factor"] *= np.where(rb[f"agent_mask_{g}"][..., i], ratio, 1.0)
    return dict(
        policy_loss=pg_loss.item(),
        entropy=entropy.item(),
        approx_kl=approx_kl.item(),
        clipfrac=float(np.mean(clipfracs)),
    )


def update_critic(team, opt, rb, args, device, rng):
    """The critic's epochs: clipped Huber loss of V(s) against the GAE returns, in value-normalized units."""
    norm = team.value_norm.normalize if args.value_norm else (lambda x: x)
    for _ in range(args.update_epochs):
        for mb in rb.minibatches(args.num_minibatches, rng, fields=("state", "values", "returns")):
            mb = to_torch(mb, device)
            new_v, target, old_v = team.critic_value(mb["state"]), norm(mb["returns"]), norm(mb["values"])
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
            v_loss = huber.mean()
            check_finite(v_loss, "the value loss", "lower --learning-rate")
            opt.zero_grad()
            v_loss.backward()
            clip_grad_norm(team.critic.parameters(), args.max_grad_norm)
            opt.step()
    ret, val = rb.targets["returns"], rb["values"]
    explained_var = 0.0 if np.var(ret) == 0 else float(1 - np.var(ret - val) / np.var(ret))
    return dict(value_loss=v_loss.item(), explained_variance=explained_var)


if __name__ == "__main__":
    cli(Args, main)
