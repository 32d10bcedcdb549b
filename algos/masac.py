"""MASAC: SAC (Haarnoja et al. 2018) with MADDPG's centralized critics; results: results/simple_spread_v3/masac.json"""

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from buffers import PrioritizedReplayBuffer, ReplayBuffer, float_tensor, joint_fields, joint_transition, to_torch
from runtime import (
    ArgumentError,
    GroupLinear,
    MakePolicy,
    MultiAgentArgs,
    Run,
    adam,
    check_action_flags,
    check_args,
    checkpoint_args,
    cli,
    crossings,
    linear_schedule,
    make_env,
    optimize,
    setup,
    soft_update,
    sub_state,
)

ALGO = "masac"
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # the Gaussian's log-std range (CleanRL's SAC)


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    continuous_actions: bool = True
    """continuous (Box) MPE actions: a tanh-squashed Gaussian; --no-continuous-actions: categorical SAC"""
    save_buffer: bool = True
    """at Ctrl-C, also write the replay buffer to replay.npz, so --resume replays the same data (else it refills)"""

    # --- MASAC (the training cadence of maddpg.py, same flag names; SAC's own settings from the SAC papers) ---
    buffer_size: int = 100_000
    """replay capacity in transitions (one step of one env, every agent): maddpg.py's and XuanCe's 100k"""
    batch_size: int = 256
    """transitions per update (SAC's and XuanCe's 256)"""
    learning_starts: int = 25_000
    """transitions collected with uniformly random actions before the first update"""
    train_frequency: int = 256
    """env steps (summed over envs) per round of --gradient-steps updates (maddpg.py's 1 per 256 transitions)"""
    gradient_steps: int = 1
    """updates per round"""
    gamma: float = 0.95
    """discount (MADDPG's 0.95 for 25-step MPE episodes)"""
    tau: float = 0.005
    """soft target-critic update rate (SAC's 0.005)"""
    actor_lr: float = 1e-3
    """Adam learning rate of the actors"""
    critic_lr: float = 1e-3
    """Adam learning rate of the twin critics"""
    alpha_lr: float = 1e-3
    """Adam learning rate of log(alpha), with --autotune"""
    alpha: float = 0.01
    """entropy temperature: fixed with --no-autotune, the starting value with --autotune (XuanCe's MASAC: 0.01)"""
    autotune: bool = True
    """tune alpha per group toward --target-entropy (SAC v2); --no-autotune keeps --alpha fixed"""
    target_entropy: float | None = None
    """entropy each agent's policy is tuned toward; default: -(action dims) for continuous actions (SAC v2), and
    0.89 log(actions) for discrete ones (CleanRL's discrete SAC)"""
    max_grad_norm: float = 0.5
    """gradient-norm clip of each agent's network separately (maddpg.py's 0.5; 0: off)"""
    hidden_size: int = 64
    """width of the two hidden layers of every actor and critic (MADDPG's 64)"""
    critic_state: bool = False
    """critics see the env's global state instead of every agent's observation"""
    share_params: bool = True
    """one actor and one twin critic per group, fed an agent-id one-hot; --no-share-params: one per agent"""
    prioritized: bool = False
    """prioritized replay (Schaul et al. 2016) by the TD error, averaged over the learning agents"""
    prioritized_replay_alpha: float = 0.6
    """priority exponent"""
    prioritized_replay_beta: float = 0.4
    """initial importance-sampling exponent, annealed linearly to 1 at --total-timesteps"""
    log_interval: int = 2_000
    """env steps between TensorBoard points of losses and SPS"""


def layer_init(layer):  # nn.Linear's default initialization, layer by layer: weights and biases U(+-1/sqrt(d_in))
    bound = layer.weight.shape[1] ** -0.5
    nn.init.uniform_(layer.weight, -bound, bound)
    nn.init.uniform_(layer.bias, -bound, bound)
    return layer


class AgentMLPs(nn.Module):
    """One MLP per agent of a group (or one shared, fed an agent-id one-hot), `copies` times over (twin critics):
    (A, B, d_in) -> (copies, A, B, d_out), one batched matmul per layer for all of them."""

    def __init__(self, n_agents, d_in, d_out, args, copies=1):
        super().__init__()
        self.ids = n_agents if args.share_params and n_agents > 1 else 0
        self.n, self.copies, h = copies * (1 if args.share_params else n_agents), copies, args.hidden_size
        self.net = nn.Sequential(
            layer_init(GroupLinear(self.n, d_in + self.ids, h)),
            nn.ReLU(),
            layer_init(GroupLinear(self.n, h, h)),
            nn.ReLU(),
            layer_init(GroupLinear(self.n, h, d_out)),
        )

    def forward(self, x):
        A, B = x.shape[:2]
        if self.ids:
            x = torch.cat([x, torch.eye(A, device=x.device)[:, None].expand(A, B, A)], -1)
        x = x.expand(self.copies, *x.shape).reshape(self.n, -1, x.shape[-1])  # shared: agents join the batch
        return self.net(x).view(self.copies, A, B, -1)


def squashed_gaussian(mean, log_std, low, high, greedy=False):
    """A reparameterized sample a = low + (tanh(u) + 1) (high - low) / 2, u ~ N(mean, std), and log pi(a) (..., d)
    -> (..., d), (...): the Gaussian's log-density minus log |da/du| = log(1 - tanh(u)^2) + log((high - low) / 2).
    greedy: u = mean."""
    u = mean if greedy else mean + log_std.exp() * torch.randn_like(mean)
    log_gauss = -0.5 * ((u - mean) / log_std.exp()).square() - log_std - 0.5 * math.log(2 * math.pi)
    log_dtanh = 2 * (math.log(2) - u - F.softplus(-2 * u))  # log(1 - tanh(u)^2), stable for large |u|
    log_prob = (log_gauss - log_dtanh - torch.log((high - low) / 2)).sum(-1)
    return low + (torch.tanh(u) + 1) * (high - low) / 2, log_prob


class Actor(nn.Module):
    """One group's stochastic policies pi_i(.|o_i) on batch-major observations (B, A, *obs_shape): a tanh-squashed
    Gaussian into the env's [low, high] (mpe2: [0, 1]), or a categorical over the available actions."""

    def __init__(self, spec, args):
        super().__init__()
        self.spec, d = spec, spec.action_dim
        self.net = AgentMLPs(spec.n_agents, int(np.prod(spec.obs_shape)), d if spec.discrete else 2 * d, args)
        if not spec.discrete:
            self.register_buffer("low", torch.as_tensor(spec.action_low))
            self.register_buffer("high", torch.as_tensor(spec.action_high))

    def policy(self, obs, avail=None):
        """Discrete: (probs, log_probs), (B, A, n), zero on unavailable actions; continuous: (mean, log_std)."""
        out = self.net(obs.flatten(2).transpose(0, 1))[0].transpose(0, 1)
        if self.spec.discrete:
            log_probs = (out if avail is None else out.masked_fill(avail == 0, -1e9)).log_softmax(-1)
            return log_probs.exp(), log_probs
        mean, log_std = out.chunk(2, -1)
        return mean, LOG_STD_MIN + (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1) / 2

    def sample(self, obs, avail=None, greedy=False, policy=None):
        """Actions (B, A, d) (discrete: one-hot) and log pi of them (B, A); continuous: reparameterized, greedy:
        tanh of the mean; discrete greedy: the most probable action. `policy`: self.policy(obs, avail), if known."""
        if not self.spec.discrete:
            return squashed_gaussian(*self.policy(obs), self.low, self.high, greedy)
        probs, log_probs = policy or self.policy(obs, avail)
        a = probs.argmax(-1) if greedy else torch.multinomial(probs.flatten(0, -2), 1).view(probs.shape[:-1])
        return F.one_hot(a, self.spec.action_dim).float(), log_probs.gather(-1, a[..., None])[..., 0]

    def uniform(self, obs, avail=None):
        """Uniformly random actions (B, A, d), for the warm-up."""
        u = torch.rand(*obs.shape[:2], self.spec.action_dim, device=obs.device)
        if not self.spec.discrete:
            return self.low + u * (self.high - self.low)
        u = u if avail is None else u * avail  # the argmax of uniforms: a uniform choice among available actions
        return F.one_hot(u.argmax(-1), self.spec.action_dim).float()


class Critic(nn.Module):
    """Per-agent centralized twin critics on input rows (A, B, D) -> (2, B, A): Q_i^k(x, a_1, ..., a_N); discrete
    actions: (2, B, A, n), Q_i^k(x, a_-i, .) for every own action, the own action's slot of the input left zero."""

    def __init__(self, spec, d_in, args):
        super().__init__()
        self.discrete = spec.discrete
        self.net = AgentMLPs(spec.n_agents, d_in, spec.action_dim if spec.discrete else 1, args, copies=2)

    def forward(self, x):
        q = self.net(x).transpose(1, 2)
        return q if self.discrete else q[..., 0]


def act(actors, obs, device, explore=True, uniform=False):
    """Every group's actions as env.step takes them: a sample of pi, its mode (greedy), or uniform (warm-up)."""
    actions = {}
    for g, actor in actors.items():
        o = float_tensor(obs.obs[g], device)
        avail = float_tensor(obs.avail_actions[g], device) if g in obs.avail_actions else None
        a = actor.uniform(o, avail) if uniform else actor.sample(o, avail, greedy=not explore)[0]
        actions[g] = a.argmax(-1).cpu().numpy() if actor.spec.discrete else a.cpu().numpy()
    return actions


def acting(actors, device, greedy=True) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: the policy's mode, or samples of it if not greedy (the
    evaluations, and a checkpoint playing a group: `actor`)."""
    return lambda num_envs, rng: lambda obs, done: act(actors, obs, device, explore=not greedy)


def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:
    """Group `group` of a checkpoint as an actor: --opponent, --self-play, results/tournament.py (runtime.opponents)."""
    args = checkpoint_args(Args, ckpt["args"])
    net = Actor(spec, args).to(device)
    net.load_state_dict(sub_state(ckpt["nets"]["actors"], f"{group}."))
    return acting(nn.ModuleDict({group: net}), device, greedy)


NETWORK_FLAGS = ("hidden_size", "share_params", "critic_state", "random_groups")  # what the weights depend on


def main(args):
    check_args(
        args,
        (
            args.autotune or (args.target_entropy is None and args.alpha_lr == Args.alpha_lr),
            "--target-entropy and --alpha-lr tune alpha, and --no-autotune keeps it fixed: drop one or the other",
        ),
    )
    device, rng = setup(args)
    env = make_env(args, args.num_envs, args.seed)
    learners = list(env.groups)  # the learning groups: make_env acts for the frozen ones
    check_action_flags(args, env)
    obs_dim = int(np.prod(env.state_shape)) if args.critic_state else 0
    obs_dim = obs_dim or sum(s.n_agents * int(np.prod(s.obs_shape)) for s in env.groups.values())
    critic_dim = obs_dim + sum(s.n_agents * s.action_dim for s in env.groups.values())
    actors = nn.ModuleDict({g: Actor(spec, args) for g, spec in env.groups.items()}).to(device)
    critics = nn.ModuleDict({g: Critic(env.groups[g], critic_dim, args) for g in learners}).to(device)
    critic_targets = copy.deepcopy(critics)
    # each group's entropy temperature as log(alpha): learned with --autotune, fixed otherwise
    alphas = nn.ParameterDict({g: nn.Parameter(torch.tensor(math.log(args.alpha)), args.autotune) for g in learners})
    alphas = alphas.to(device)
    nets = dict(actors=actors, critics=critics, critic_targets=critic_targets, alphas=alphas)
    make_greedy = acting(actors, device)  # evaluation: the policy's mode

    target_entropy = {g: target_entropy_of(env.groups[g], args) for g in learners}
    optimizers = dict(
        actor=adam([p for g in learners for p in actors[g].parameters()], args.actor_lr),
        critic=adam(critics.parameters(), args.critic_lr),
    )  # fused Adam: runtime/optim.py
    if args.autotune:
        optimizers["alpha"] = torch.optim.Adam(alphas.parameters(), lr=args.alpha_lr)
    fields = joint_fields(env.groups, env.state_shape if args.critic_state else None)
    per = dict(alpha=args.prioritized_replay_alpha) if args.prioritized else {}
    rb = (PrioritizedReplayBuffer if args.prioritized else ReplayBuffer)(args.buffer_size, args.num_envs, fields, **per)
    run = Run(args, ALGO, env, nets, optimizers, rng, make_greedy, network_flags=NETWORK_FLAGS, replay=rb)
    writer, global_step, num_updates = run.writer, run.global_step, run.counters.get("num_updates", 0)
    learning_starts = max(min(args.learning_starts, rb.capacity), args.batch_size)
    obs, losses = run.begin(env.reset(), losses={})  # what the loop carries (--resume: from last.pt, with the env)
    with run:
        while global_step < args.total_timesteps:
            # ACT: uniformly random until --learning-starts, then a sample of pi(.|o)
            with torch.no_grad():
                actions = act(actors, obs, device, uniform=global_step < args.learning_starts)
            # STEP
            step = env.step(actions)
            global_step += args.num_envs
            # STORE: the next observation is step.final (the pre-reset one where an episode ended)
            rb.add(**joint_transition(obs, actions, step, env.groups, args.critic_state))
            run.log_episodes(step.episodes, global_step)
            obs = step.next

            # UPDATE: --gradient-steps updates per --train-frequency env steps
            rounds = crossings(global_step, args.num_envs, args.train_frequency)
            if len(rb) >= learning_starts:
                beta = linear_schedule(
                    args.prioritized_replay_beta, 1.0, args.total_timesteps, global_step
                )  # to 1 (--prioritized)
                for _ in range(rounds * args.gradient_steps):
                    sample = rb.sample(args.batch_size, rng, **({"beta": beta} if args.prioritized else {}))
                    new_losses, td = update(to_torch(sample, device), nets, optimizers, args, learners, target_entropy)
                    losses, num_updates = losses | new_losses, num_updates + 1
                    if args.prioritized:
                        rb.update_priorities(sample["indices"], td.cpu().numpy())

            # LOG
            if crossings(global_step, args.num_envs, args.log_interval) or global_step >= args.total_timesteps:
                writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
                for k, v in losses.items():  # the latest update's: the mean over agents, then per group
                    writer.add_scalar(f"losses/{k}", v.item(), global_step)
                if losses and args.prioritized:
                    writer.add_scalar("charts/beta", beta, global_step)
            run.step(global_step, loop=dict(losses=losses), num_updates=num_updates)  # EVAL, checkpoints, Ctrl-C
    run.finish()
    env.close()


# --- what the loop calls: the MASAC update ---


def target_entropy_of(spec, args):
    """--target-entropy, or the default for the group's actions: -d (continuous), 0.89 log n (discrete)."""
    if args.target_entropy is None:
        return 0.89 * math.log(spec.action_dim) if spec.discrete else -float(spec.action_dim)
    if spec.discrete and args.target_entropy >= math.log(spec.action_dim):  # alpha would grow without bound
        raise ArgumentError(
            f"--target-entropy {args.target_entropy} is out of reach for {spec.name}'s "
            f"{spec.action_dim} actions (at most log {spec.action_dim} = "
            f"{math.log(spec.action_dim):.3f}): give a smaller one, or drop it"
        )
    return args.target_entropy


def soft_values(q, log_probs, alpha, probs=None):
    """V(s) = E_a~pi[Q(s, a) - alpha log pi(a|s)]: continuous, at the sampled action (q, log_probs (B, A)); discrete,
    the exact expectation over the own actions (q, log_probs, probs (B, A, n))."""
    if probs is None:
        return q - alpha * log_probs
    return (probs * (q - alpha * log_probs)).sum(-1)


def critic_input(x_obs, actions, n_agents, g=None, own=None):
    """The input of group g's critics, (A_g, B, D): [every observation (or the state), every agent's action].

    With `own` (B, A_g, d), row i carries own[:, i] in agent i's own slot and `actions` elsewhere: the actor's fresh
    sample (its gradient flows through its own action only), or zeros (discrete: Q of every own action at once)."""
    parts = [x_obs]
    for h, a in actions.items():  # a: (B, A_h, d_h), one-hot for discrete actions
        if h == g and own is not None:
            eye = torch.eye(n_agents, dtype=torch.bool, device=a.device)[:, None, :, None]
            parts.append(torch.where(eye, own[None], a[None]).flatten(2))  # (A_g, B, A_g * d)
        else:
            parts.append(a.flatten(1))
    return torch.cat([p.expand(n_agents, *p.shape[-2:]) for p in parts], -1)


def update(b, nets, optimizers, args, learners, target_entropy):
    """One MASAC update from a batch-major batch `b`: the twin critics, the actors, the temperatures, the targets."""
    actors, critics = nets["actors"], nets["critics"]
    critic_targets, alphas = nets["critic_targets"], nets["alphas"]
    specs = {g: actors[g].spec for g in learners}
    sizes = {g: s.n_agents for g, s in specs.items()}
    onehot = lambda a, s: F.one_hot(a, s.action_dim).float() if s.discrete else a  # noqa: E731
    actions = {g: onehot(b[f"actions_{g}"], s) for g, s in specs.items()}
    if args.critic_state:
        x_obs, x_next = b["state"].flatten(1), b["next_state"].flatten(1)
    else:  # every agent's observation, concatenated: (B, sum_g A_g * obs_dim_g)
        x_obs, x_next = (torch.cat([b[f"{k}_{g}"].flatten(1) for g in specs], -1) for k in ("obs", "next_obs"))
    weights = b["weights"][:, None] if "weights" in b else 1.0  # prioritized replay's importance weights
    alpha = {g: alphas[g].detach().exp() for g in learners}
    own = lambda g, a: torch.zeros_like(a) if specs[g].discrete else a  # noqa: E731  (discrete: Q of every action)

    # TARGETS: y_i = r_i + gamma (1 - terminated_i) E_a'~pi[min_k Q'^k_i(x', a') - alpha log pi_i(a'_i|o'_i)], with
    # a' sampled from the current policies (no target actor in SAC); discrete: exact over a'_i; truncation bootstraps
    with torch.no_grad():
        next_actions, next_log_probs, next_policy = {}, {}, {}
        for g, actor in actors.items():
            o, avail = b[f"next_obs_{g}"], b.get(f"next_avail_{g}")
            next_policy[g] = actor.policy(o, avail) if specs[g].discrete else None  # discrete: the target needs it
            next_actions[g], next_log_probs[g] = actor.sample(o, avail, policy=next_policy[g])
        targets = {}
        for g in learners:
            x = critic_input(x_next, next_actions, sizes[g], g, own(g, next_actions[g]))
            q_next = critic_targets[g](x).min(0).values
            if specs[g].discrete:  # the expectation over the own action needs the whole distribution
                probs, log_probs = next_policy[g]
                v_next = soft_values(q_next, log_probs, alpha[g], probs)
            else:
                v_next = soft_values(q_next, next_log_probs[g], alpha[g])
            targets[g] = b[f"rewards_{g}"] + args.gamma * (1 - b[f"terminated_{g}"]) * v_next

    # UPDATE critics: squared TD errors of both twins of every learning agent (alive at the step), summed
    qf_losses, q_values, td = {}, {}, 0.0
    for g in learners:
        q = critics[g](critic_input(x_obs, actions, sizes[g], g, own(g, actions[g])))  # (2, B, A[, n])
        if specs[g].discrete:
            q = q.gather(-1, b[f"actions_{g}"].expand(2, *b[f"actions_{g}"].shape)[..., None])[..., 0]
        err = (q - targets[g]) * b[f"agent_mask_{g}"]
        qf_losses[g], q_values[g] = (weights * err**2).mean(1).sum(0), q[0].detach().mean(0)  # per agent: (A,)
        td = td + err[0].detach().abs().sum(1)
    qf_loss = torch.cat(list(qf_losses.values())).sum()
    optimize(qf_loss, optimizers["critic"], critics.values(), args.max_grad_norm, "critic")

    # UPDATE actors: minimize E[alpha log pi_i(a_i|o_i) - min_k Q_i^k(x, a_-i, a_i)], the other agents' actions from
    # the batch; continuous: a_i reparameterized; discrete: the exact expectation over a_i
    actor_losses, entropies = {}, {}
    critics.requires_grad_(False)
    for g in learners:
        obs, avail, mask = b[f"obs_{g}"], b.get(f"avail_{g}"), b[f"agent_mask_{g}"]
        if specs[g].discrete:
            probs, log_probs = actors[g].policy(obs, avail)
            q = critics[g](critic_input(x_obs, actions, sizes[g], g, torch.zeros_like(probs))).min(0).values
            loss = (probs * (alpha[g] * log_probs - q)).sum(-1)
            entropies[g] = -(probs * log_probs).sum(-1).detach()
        else:
            a, log_prob = actors[g].sample(obs)
            q = critics[g](critic_input(x_obs, actions, sizes[g], g, a)).min(0).values
            loss, entropies[g] = alpha[g] * log_prob - q, -log_prob.detach()
        actor_losses[g] = (loss * mask).mean(0)
    critics.requires_grad_(True)
    actor_loss = torch.cat(list(actor_losses.values())).sum()
    optimize(actor_loss, optimizers["actor"], [actors[g] for g in learners], args.max_grad_norm, "actor")

    # UPDATE alpha: descend log(alpha) (H - target) per group, so alpha grows while the entropy H is below target
    if args.autotune:
        alpha_loss = sum(
            alphas[g]
            * ((entropies[g] - target_entropy[g]) * b[f"agent_mask_{g}"]).sum()
            / b[f"agent_mask_{g}"].sum().clamp(min=1)
            for g in learners
        )
        optimize(alpha_loss, optimizers["alpha"], (), 0, "alpha")
    soft_update(critic_targets, critics, args.tau)
    # key -> group -> (A_g,)
    per_agent = {
        "qf_loss": qf_losses,
        "actor_loss": actor_losses,
        "q_values": q_values,
        "entropy": {g: entropies[g].mean(0) for g in learners},
    }
    losses = {k: torch.cat(list(v.values())).detach().mean() for k, v in per_agent.items()}  # mean over agents
    losses["alpha"] = torch.stack(list(alpha.values())).mean()
    if len(learners) > 1:
        losses |= {f"{k}/{g}": x.detach().mean() for k, v in per_agent.items() for g, x in v.items()}
        losses |= {f"alpha/{g}": a for g, a in alpha.items()}
    return losses, td / sum(sizes[g] for g in learners)


if __name__ == "__main__":
    cli(Args, main)
