"""IPPO (de Witt et al. 2020, arXiv:2011.09533), results: results/simple_spread_v3/ippo.json"""

import copy
import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Annotated

import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Categorical, Normal
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import envs
from buffers import BufferInputError, RolloutBuffer, to_torch

ALGO = "ippo"


@dataclass
class Args:
    # --- shared flags (every script) ---
    env_id: Annotated[str, tyro.conf.arg(aliases=("--env",))] = "simple_spread_v3"
    """environment id (see envs.known_ids()) or 'module:function'; --env is an alias"""
    seed: int = 1
    """seed of numpy, torch and the envs"""
    total_timesteps: int = 10_000_000
    """env steps, summed over all envs"""
    num_envs: int = 128
    """parallel training envs"""
    backend: str = "auto"
    """env backend: 'numba' (compiled MPE), 'pettingzoo', or 'auto' (numba for MPE ids when available)"""
    vector: str = "sync"
    """PettingZoo vectorization: 'sync' or 'subproc'"""
    continuous_actions: bool = False
    """continuous (Box) actions, for MPE envs"""
    max_cycles: int | None = None
    """episode length limit passed to the env (default: the env's own)"""
    map_size: int | None = None
    """MAgent2 map size (default: the env's own)"""
    env_kwargs: str = "{}"
    """further env keyword arguments as JSON, e.g. '{"N": 5}'"""
    cuda: bool = False
    """train on CUDA (an error if no device is available)"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic"""
    torch_threads: int = 1
    """torch CPU threads (0: torch's default); 1 is fastest for small networks beside the envs"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "flashmarl"
    wandb_entity: str | None = None
    capture_video: bool = False
    """record a greedy episode at each evaluation (or with --eval-checkpoint)"""
    save_model: bool = True
    """write last.pt at the end and best.pt at each best evaluation (Ctrl-C always writes last.pt)"""
    eval_interval: int = 100_000
    """env steps between greedy evaluations (0: only at the end)"""
    eval_episodes: int = 10
    """episodes per evaluation"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint greedily and exit"""
    resume: str | None = None
    """continue the run in this run directory from its last.pt"""
    run_dir: str | None = None
    """where to write (default runs/<env>__ippo__<seed>__<time>)"""

    # --- IPPO (defaults: the MAPPO paper's MPE settings, shared so the two compare) ---
    learning_rate: float = 7e-4
    anneal_lr: bool = True
    """linear learning-rate decay to 0"""
    num_steps: int = 25
    """steps per env per rollout"""
    gamma: float = 0.95
    """discount; 0.95 for 25-step MPE episodes (the paper's 0.99 learned slower: results/simple_spread_v3/tuning.md)"""
    gae_lambda: float = 0.95
    num_minibatches: int = 1
    update_epochs: int = 10
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 1.0
    max_grad_norm: float = 10.0
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
    feature_norm: bool = True
    """LayerNorm on the actor's and critic's inputs (the MAPPO paper's feature normalization)"""
    rnn: bool = False
    """a GRU cell in place of the second hidden layer of actor and critic (recurrent IPPO)"""
    rnn_chunk: int = 25
    """--rnn: steps per training sequence (divides --num-steps); each starts from the stored hidden state"""
    hidden_size: int = 64
    share_params: bool = True
    """one network per group with an agent-id one-hot (--no-share-params: one network per agent)"""
    random_groups: tuple[str, ...] = ()
    """groups frozen to a uniformly random policy, e.g. adversary"""

    # --- derived at runtime ---
    batch_size: int = field(default=0, init=False)
    num_iterations: int = field(default=0, init=False)


class GroupLinear(nn.Module):
    """n independent linear layers along the agent axis (n=1: one layer shared by every agent)."""

    def __init__(self, n, d_in, d_out, std=2**0.5, ortho=True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(n, 1, d_out))
        for w in self.weight.data:
            nn.init.orthogonal_(w, std) if ortho else nn.init.kaiming_uniform_(w.T, a=5**0.5)

    def forward(self, x):  # (B, A, d_in) -> (B, A, d_out)
        if self.weight.shape[0] == 1:
            return x @ self.weight[0] + self.bias[0]
        return torch.einsum("bai,aio->bao", x, self.weight) + self.bias.transpose(0, 1)


class GroupGRU(nn.Module):
    """A GRU cell per agent (n=1: shared) on (B, A, h) inputs and hidden states."""

    def __init__(self, n, h, ortho=True):
        super().__init__()
        self.x2g, self.h2g = GroupLinear(n, h, 3 * h, 1.0, ortho), GroupLinear(n, h, 3 * h, 1.0, ortho)

    def forward(self, x, hx):
        xr, xz, xn = self.x2g(x).chunk(3, -1)
        hr, hz, hn = self.h2g(hx).chunk(3, -1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        return (1 - z) * torch.tanh(xn + r * hn) + z * hx


class Net(nn.Module):
    """[LayerNorm] -> Linear -> ReLU -> Linear -> ReLU (--rnn: a GRU cell) -> Linear, on (B, A, d_in)."""

    def __init__(self, n, d_in, d_out, args, out_std):
        super().__init__()
        h, o = args.hidden_size, args.ortho_init
        self.norm = nn.LayerNorm(d_in) if args.feature_norm else nn.Identity()  # inputs of different scales
        self.fc = GroupLinear(n, d_in, h, ortho=o)
        self.mid = GroupGRU(n, h, o) if args.rnn else GroupLinear(n, h, h, ortho=o)
        self.head = GroupLinear(n, h, d_out, std=out_std, ortho=o)

    def forward(self, x, hx=None):  # -> (B, A, d_out) and the next hidden state (None without --rnn)
        x = torch.relu(self.fc(self.norm(x)))
        if hx is None:
            return self.head(torch.relu(self.mid(x))), None
        hx = self.mid(x, hx)
        return self.head(hx), hx


class ValueNorm(nn.Module):
    """Running mean/std of value targets; the critic predicts values in these normalized units."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("var", torch.ones(()))
        self.register_buffer("count", torch.tensor(1e-4))

    def update(self, x):  # parallel-variance merge of the batch into the running moments
        batch_mean, batch_var, n = x.mean(), x.var(unbiased=False), x.numel()
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total

    def normalize(self, x):
        return (x - self.mean) / torch.sqrt(self.var + 1e-8)

    def denormalize(self, x):
        return x * torch.sqrt(self.var + 1e-8) + self.mean


class Policy(nn.Module):
    """One group's actor and critic, both on the agent's own observation: each agent learns independently."""

    def __init__(self, spec, args):
        super().__init__()
        self.spec, self.with_id = spec, args.share_params and spec.n_agents > 1
        n, ids = (1 if args.share_params else spec.n_agents), (spec.n_agents if self.with_id else 0)
        obs_dim = int(np.prod(spec.obs_shape))
        self.actor = Net(n, obs_dim + ids, spec.action_dim, args, out_std=0.01)
        self.critic = Net(n, obs_dim + ids, 1, args, out_std=1.0)
        if not spec.discrete:  # state-independent log-std
            self.logstd = nn.Parameter(torch.zeros(spec.action_dim))
        self.value_norm, self.use_value_norm = ValueNorm(), args.value_norm

    def _with_id(self, x):  # append a one-hot agent id so a shared network can tell agents apart
        if not self.with_id:
            return x
        eye = torch.eye(self.spec.n_agents, device=x.device).expand(*x.shape[:-1], self.spec.n_agents)
        return torch.cat([x, eye], -1)

    def actor_out(self, obs, hx=None):  # obs (B, A, *obs_shape) -> (logits or means, next hidden state)
        return self.actor(self._with_id(obs.flatten(2)), hx)

    def dist(self, out, avail=None):  # actor outputs (..., A, action_dim) -> a distribution over (..., A) actions
        if not self.spec.discrete:
            return Normal(out, self.logstd.exp().expand_as(out), validate_args=False)  # checks cost ~10% of acting
        if avail is not None:  # action masks: unavailable actions get zero probability
            out = out.masked_fill(avail == 0, -1e9)
        return Categorical(logits=out, validate_args=False)

    def critic_values(self, obs, hx=None):  # (B, A, *obs_shape) -> normalized V (B, A) from own obs, next hidden
        v, hx = self.critic(self._with_id(obs.flatten(2)), hx)
        return v.squeeze(-1), hx

    def value(self, obs, hx=None):  # V in return units (numpy) and the next hidden state
        v, hx = self.critic_values(obs, hx)
        return (self.value_norm.denormalize(v) if self.use_value_norm else v).cpu().numpy(), hx

    def log_prob_entropy(self, d, actions):
        if self.spec.discrete:
            return d.log_prob(actions), d.entropy()
        return d.log_prob(actions).sum(-1), d.entropy().sum(-1)


def t(x, device):
    return torch.as_tensor(np.asarray(x), dtype=torch.float32, device=device)


def masked_mean(mask, x):
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def initial_hidden(policies, args, num_envs, device):  # group -> zero hidden states (None without --rnn)
    return {g: torch.zeros(num_envs, p.spec.n_agents, args.hidden_size, device=device) if args.rnn else None
            for g, p in policies.items()}  # fmt: skip


def reset_finished(hidden, done, device):  # zero the hidden states of the envs whose episode just ended
    keep = t(~done, device).view(-1, 1, 1)
    return {g: None if h is None else h * keep for g, h in hidden.items()}


def act(policies, obs, device, rng, hidden, random_groups=(), greedy=False):
    """Actions of every group (numpy, what env.step takes) and, for the learning groups, what the buffer stores:
    the sampled actions (Gaussian samples before clipping to the Box) and their log-probabilities.

    `hidden` (group -> the actors' hidden states, or None) is advanced in place.
    """
    actions, taken = {}, {}
    for g, pol in policies.items():
        spec, avail = pol.spec, obs.avail_actions.get(g)
        if g in random_groups:  # a frozen group: uniform over the (available) actions
            shape = (*obs.agent_mask[g].shape, spec.action_dim)
            if spec.discrete:
                actions[g] = np.argmax(rng.random(shape) * (1 if avail is None else avail), -1)
            else:
                actions[g] = rng.uniform(spec.action_low, spec.action_high, shape).astype(np.float32)
            continue
        out, hidden[g] = pol.actor_out(t(obs.obs[g], device), hidden[g])
        d = pol.dist(out, None if avail is None else t(avail, device))
        a = (d.probs.argmax(-1) if spec.discrete else d.mean) if greedy else d.sample()
        taken[g] = {"actions": a.cpu().numpy(), "logprobs": pol.log_prob_entropy(d, a)[0].cpu().numpy()}
        a = taken[g]["actions"]  # the log-probability belongs to the sample: only the env sees it clipped
        actions[g] = a if spec.discrete else np.clip(a, spec.action_low, spec.action_high).astype(np.float32)
    return actions, taken


def env_kwargs(args):
    try:
        kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as e:
        raise ValueError(f"--env-kwargs is not valid JSON ({e}); use e.g. '{{\"N\": 5}}'") from None
    flags = dict(continuous_actions=args.continuous_actions or None, max_cycles=args.max_cycles, map_size=args.map_size)
    return kwargs | {k: v for k, v in flags.items() if v is not None}


def evaluate(policies, args, device, seed, video_path=None):
    """Greedy episodes on the standard PettingZoo env, one per env (so short episodes are not favoured)."""
    n = args.eval_episodes
    env = envs.make(args.env_id, num_envs=n, seed=seed, backend="pettingzoo", **env_kwargs(args))
    obs, returns, group_returns, rng = env.reset(), [None] * n, {}, np.random.default_rng(seed)
    hidden = initial_hidden(policies, args, n, device)
    with torch.no_grad():
        while any(r is None for r in returns):
            step = env.step(act(policies, obs, device, rng, hidden, args.random_groups, greedy=True)[0])
            hidden = reset_finished(hidden, step.done, device)
            for ep in step.episodes:
                if returns[ep.env_index] is None:
                    returns[ep.env_index] = ep.episode_return
                    for g, r in ep.group_returns.items():
                        group_returns.setdefault(g, []).append(r)
            obs = step.next
        env.close()
        if video_path is not None:  # one env, so one set of hidden states, reset with the episode
            hidden = initial_hidden(policies, args, 1, device)
            greedy = lambda o: act(policies, o, device, rng, hidden, args.random_groups, greedy=True)[0]  # noqa: E731
            envs.record_episode(args.env_id, greedy, video_path, seed=seed, **env_kwargs(args))
    return np.array(returns), {g: float(np.mean(r)) for g, r in group_returns.items()}


def env_signature(env):
    """What a checkpoint must match: groups, agent counts, observation and action spaces."""
    return {g: [s.n_agents, list(s.obs_shape), s.discrete, s.action_dim] for g, s in env.groups.items()}


def save_checkpoint(path, policies, optimizers, args, signature, global_step, iteration, rng, best_eval):
    """Everything --resume needs, in types that torch.load(weights_only=True) accepts."""
    ckpt = dict(algo=ALGO, env_id=args.env_id, signature=signature, args=json.loads(json.dumps(asdict(args))),
                policies={g: p.state_dict() for g, p in policies.items()},
                optimizers={g: o.state_dict() for g, o in optimizers.items()},
                global_step=global_step, best_eval=float(best_eval), iteration=iteration,
                rng={"torch": torch.get_rng_state(), "numpy": rng.bit_generator.state})  # fmt: skip
    torch.save(ckpt, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)  # never leave a half-written checkpoint behind


def load_checkpoint(path, args, signature):
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a damaged file
        raise ValueError(
            f"checkpoint {path} is unreadable (corrupt or not a torch file): {e}".splitlines()[0]
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("algo") != ALGO:
        raise ValueError(f"checkpoint {path} is not a {ALGO} checkpoint")
    if ckpt["env_id"] != args.env_id or ckpt["signature"] != signature:
        raise ValueError(
            f"checkpoint {path} was trained on {ckpt['env_id']} with spaces {ckpt['signature']}, which do not "
            f"match {args.env_id} with {signature}: pass the same --env-id and env flags"
        )
    return ckpt


NETWORK_FLAGS = ("hidden_size", "share_params", "feature_norm", "rnn")  # what a checkpoint's weights depend on


def load_weights(policies, ckpt, path):
    try:
        for g, p in policies.items():
            p.load_state_dict(ckpt["policies"][g])
    except RuntimeError as e:  # e.g. a checkpoint written before a change of the networks' layout
        raise ValueError(
            f"checkpoint {path} holds networks of another layout than this script builds "
            f"({str(e).splitlines()[1].strip()[:120]})"
        ) from None


def rollout_fields(spec, args):
    """One group's rollout, declared once: name -> (per-env shape, dtype)."""
    A = spec.n_agents
    fields = {
        "obs": ((A, *spec.obs_shape), np.float32),
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


def forward_batch(pol, mb, args):
    """Actor outputs and normalized values of a minibatch: flat samples, or --rnn chunks (L, N, ...) unrolled."""
    if not args.rnn:
        return pol.actor_out(mb["obs"])[0], pol.critic_values(mb["obs"])[0]
    outs, values, ha, hc = [], [], mb["h_actor"][0], mb["h_critic"][0]
    for i in range(len(mb["obs"])):  # the hidden states restart at zero where an episode began
        keep = (1 - mb["starts"][i]).view(-1, 1, 1)
        out, ha = pol.actor_out(mb["obs"][i], ha * keep)
        v, hc = pol.critic_values(mb["obs"][i], hc * keep)
        outs.append(out)
        values.append(v)
    return torch.stack(outs), torch.stack(values)


def update(pol, opt, rb, args, device, rng):
    """PPO epochs: clipped surrogate, clipped Huber value loss, entropy bonus; dead agents masked out."""
    clipfracs = []
    norm = pol.value_norm.normalize if args.value_norm else (lambda x: x)
    for _ in range(args.update_epochs):
        batches = rb.sequences(args.rnn_chunk, args.num_minibatches, rng) if args.rnn else rb.minibatches(
            args.num_minibatches, rng)  # fmt: skip
        for mb in batches:
            mb = to_torch(mb, device)
            mask = mb["agent_mask"]  # death masking: a dead agent's steps weigh nothing in any loss
            out, new_v = forward_batch(pol, mb, args)  # new_v in normalized units, like the targets below
            logprob, entropy = pol.log_prob_entropy(pol.dist(out, mb.get("avail_actions")), mb["actions"])
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
                err = torch.max(err, (target - old_v - (new_v - old_v).clamp(-args.clip_coef, args.clip_coef)).abs())
            d = args.huber_delta
            v_loss = masked_mean(
                mask, torch.where(err < d, 0.5 * err**2, d * (err - 0.5 * d)) if d > 0 else 0.5 * err**2
            )
            ent = masked_mean(mask, entropy)
            loss = pg_loss - args.ent_coef * ent + args.vf_coef * v_loss
            if not torch.isfinite(loss):  # stop before the weights are poisoned
                raise FloatingPointError(
                    f"group {pol.spec.name}: the loss became {loss.item()} (policy {pg_loss.item():.3g}, value "
                    f"{v_loss.item():.3g}); lower --learning-rate or --max-grad-norm, or check the rewards"
                )
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(pol.actor.parameters(), args.max_grad_norm)
            nn.utils.clip_grad_norm_(pol.critic.parameters(), args.max_grad_norm)
            opt.step()
    ret, val = rb.targets["returns"], rb["values"]
    explained_var = 0.0 if np.var(ret) == 0 else float(1 - np.var(ret - val) / np.var(ret))
    return dict(policy_loss=pg_loss.item(), value_loss=v_loss.item(), entropy=ent.item(), approx_kl=approx_kl.item(),
                clipfrac=float(np.mean(clipfracs)), explained_variance=explained_var)  # fmt: skip


def main(args):
    kwargs = env_kwargs(args)
    if args.cuda and not torch.cuda.is_available():
        raise ValueError("--cuda was given but no CUDA device is available: drop --cuda to train on the CPU")
    device = torch.device("cuda" if args.cuda else "cpu")
    if args.rnn and (args.rnn_chunk < 1 or args.num_steps % args.rnn_chunk):
        raise ValueError(f"--rnn-chunk {args.rnn_chunk} must divide --num-steps {args.num_steps}")
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)

    # seeding, envs, networks
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    rng = np.random.default_rng(args.seed)
    env = envs.make(args.env_id, args.num_envs, args.seed, vector=args.vector, backend=args.backend, **kwargs)
    signature = env_signature(env)
    if unknown := [g for g in args.random_groups if g not in env.groups]:
        raise ValueError(f"--random-groups {unknown}: {args.env_id} has the groups {list(env.groups)}")
    ckpt_path = args.eval_checkpoint or (os.path.join(args.resume, "last.pt") if args.resume else None)
    ckpt = load_checkpoint(ckpt_path, args, signature) if ckpt_path else None
    for k in NETWORK_FLAGS if ckpt else ():  # the networks are rebuilt as they were trained, whatever the flags
        setattr(args, k, ckpt["args"].get(k, getattr(args, k)))
    policies = {g: Policy(spec, args).to(device) for g, spec in env.groups.items()}
    optimizers = {g: torch.optim.Adam(p.parameters(), lr=args.learning_rate, eps=1e-5) for g, p in policies.items()}
    learners = [g for g in policies if g not in args.random_groups]

    if args.eval_checkpoint:
        load_weights(policies, ckpt, ckpt_path)
        video = os.path.join(os.path.dirname(args.eval_checkpoint), "eval.mp4") if args.capture_video else None
        returns, per_group = evaluate(policies, args, device, args.seed + 10_000, video)
        print(f"{args.env_id} {ALGO} {args.eval_checkpoint}: episodic return {returns.mean():.2f} ± "
              f"{returns.std():.2f} over {len(returns)} greedy episodes; per group {per_group}"
              + (f"; video {video}" if video else ""))  # fmt: skip
        return

    args.batch_size = args.num_envs * args.num_steps
    args.num_iterations = max(1, args.total_timesteps // args.batch_size)
    global_step, start_iteration = 0, 1
    if args.resume:  # same weights, optimizer moments, step counter and RNG: the curve continues
        run_dir = args.resume
        load_weights(policies, ckpt, ckpt_path)
        for g in policies:
            optimizers[g].load_state_dict(ckpt["optimizers"][g])
        global_step, start_iteration = ckpt["global_step"], ckpt["iteration"] + 1
        torch.set_rng_state(ckpt["rng"]["torch"])
        rng.bit_generator.state = ckpt["rng"]["numpy"]
    else:
        run_dir = args.run_dir or f"runs/{args.env_id}__{ALGO}__{args.seed}__{int(time.time())}"
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(asdict(args) | {"env_class": type(env).__name__}, f, indent=2)
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=asdict(args),
                   name=os.path.basename(run_dir), sync_tensorboard=True)  # fmt: skip
    writer = SummaryWriter(run_dir)
    buffers = {g: RolloutBuffer(args.num_steps, args.num_envs, rollout_fields(env.groups[g], args))
               for g in learners}  # fmt: skip

    def checkpoint(name, step, it, best):
        if args.save_model or name == "last.pt":
            save_checkpoint(os.path.join(run_dir, name), policies, optimizers, args, signature, step, it, rng, best)

    def run_eval(step, it, best):
        """Greedy evaluation on the standard env; keeps best.pt and an optional video."""
        video = os.path.join(run_dir, "videos", f"step_{step}.mp4") if args.capture_video else None
        returns, per_group = evaluate(policies, args, device, args.seed + 10_000, video)
        writer.add_scalar("eval/episodic_return", returns.mean(), step)
        for g, r in per_group.items():
            writer.add_scalar(f"eval/episodic_return/{g}", r, step)
        if returns.mean() > best:
            checkpoint("best.pt", step, it, returns.mean())
        return float(returns.mean()), max(best, float(returns.mean()))

    next_eval = (global_step // args.eval_interval + 1) * args.eval_interval if args.eval_interval else None
    best_eval = ckpt.get("best_eval", -np.inf) if args.resume else -np.inf  # a resumed run keeps best.pt
    last_eval, last_eval_step = float("nan"), -1
    obs, starts = env.reset(), np.ones(args.num_envs, bool)
    h_actor = initial_hidden(policies, args, args.num_envs, device)  # --rnn: group -> (E, A, H), else None
    h_critic = initial_hidden(policies, args, args.num_envs, device)
    start_time, start_step, iteration = time.time(), global_step, start_iteration - 1
    finished, before_update = iteration, None  # the last finished update; weights while one runs
    bar = tqdm(total=args.num_iterations * args.batch_size, initial=global_step, unit="step", dynamic_ncols=True)
    try:
        for iteration in range(start_iteration, args.num_iterations + 1):
            lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
            for g in learners:
                optimizers[g].param_groups[0]["lr"] = lr

            for _ in range(args.num_steps):
                # ACT (recurrent: the hidden states the step is acted on are stored with it)
                with torch.no_grad():
                    stored = {g: {"h_actor": h_actor[g].cpu().numpy(), "h_critic": h_critic[g].cpu().numpy(),
                                  "starts": starts} if args.rnn else {} for g in learners}  # fmt: skip
                    actions, taken = act(policies, obs, device, rng, h_actor, args.random_groups)
                    values = {}
                    for g in learners:
                        values[g], h_critic[g] = policies[g].value(t(obs.obs[g], device), h_critic[g])
                # STEP
                step = env.step(actions)
                global_step += args.num_envs
                # STORE: a truncated episode bootstraps from V(final observation), not the next episode's first
                with torch.no_grad():
                    trunc = step.truncated.any()
                    final_values = {g: policies[g].value(t(step.final.obs[g], device), h_critic[g])[0] if trunc
                                    else 0 * values[g] for g in learners}  # fmt: skip
                for g in learners:
                    avail = {"avail_actions": obs.avail_actions[g]} if g in obs.avail_actions else {}
                    buffers[g].add(obs=obs.obs[g], **taken[g], values=values[g],
                                   rewards=step.rewards[g], terminated=step.terminated[g], truncated=step.truncated,
                                   final_values=final_values[g], agent_mask=obs.agent_mask[g], **avail,
                                   **stored[g])  # fmt: skip
                h_actor = reset_finished(h_actor, step.done, device)  # the next episodes start from zero
                h_critic = reset_finished(h_critic, step.done, device)
                starts = step.done
                if eps := step.episodes:  # one point per step: the mean over the episodes that just finished
                    writer.add_scalar("charts/episodic_return", np.mean([e.episode_return for e in eps]), global_step)
                    writer.add_scalar("charts/episodic_length", np.mean([e.length for e in eps]), global_step)
                    for g in eps[0].group_returns:
                        r = np.mean([e.group_returns[g] for e in eps])
                        writer.add_scalar(f"charts/episodic_return/{g}", r, global_step)
                obs = step.next

            # TARGETS and UPDATE, group by group (a stopped update is undone: see the except below)
            before_update = copy.deepcopy({g: (policies[g].state_dict(), optimizers[g].state_dict()) for g in learners})
            for g in learners:
                pol, rb = policies[g], buffers[g]
                with torch.no_grad():
                    last_values = pol.value(t(obs.obs[g], device), h_critic[g])[0]
                rb.compute_gae(last_values, args.gamma, args.gae_lambda)
                if args.value_norm:
                    alive = torch.as_tensor(rb["agent_mask"])
                    pol.value_norm.update(torch.as_tensor(rb.targets["returns"])[alive].to(device))
                for k, v in update(pol, optimizers[g], rb, args, device, rng).items():
                    writer.add_scalar(f"losses/{k}" if len(learners) == 1 else f"losses/{k}/{g}", v, global_step)
                rb.reset()
            finished, before_update = iteration, None

            # LOG
            sps = int((global_step - start_step) / (time.time() - start_time))
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/learning_rate", lr, global_step)
            bar.update(args.batch_size)
            bar.set_postfix(SPS=sps, eval=f"{last_eval:.2f}")

            # EVAL
            if next_eval is not None and global_step >= next_eval:
                next_eval += args.eval_interval
                last_eval, best_eval = run_eval(global_step, iteration, best_eval)
                last_eval_step = global_step
    except (KeyboardInterrupt, FloatingPointError) as e:
        # an unfinished iteration is dropped, and an update it stopped inside is undone (its weights may be
        # diverging): last.pt holds the weights of the last finished update, which --resume goes on from
        bar.close()
        for g, (weights, moments) in (before_update or {}).items():
            policies[g].load_state_dict(weights)
            optimizers[g].load_state_dict(moments)
        checkpoint("last.pt", finished * args.batch_size, finished, best_eval)
        writer.close()
        if isinstance(e, FloatingPointError):
            raise FloatingPointError(f"{e}; saved {run_dir}/last.pt (the weights before this update)") from None
        print(f"interrupted at step {global_step}: saved {run_dir}/last.pt; continue with --resume {run_dir}")
        sys.exit(130)
    bar.close()

    if last_eval_step != global_step:
        last_eval, best_eval = run_eval(global_step, iteration, best_eval)
    checkpoint("last.pt", global_step, iteration, best_eval)
    writer.close()
    env.close()
    open(os.path.join(run_dir, "DONE"), "w").close()
    print(f"done: {global_step} steps, final greedy return {last_eval:.2f} (best {best_eval:.2f}); run dir {run_dir}")


if __name__ == "__main__":
    # Ctrl-C, kill -INT and SIGTERM (kill, a cluster's preemption) all save last.pt, also in a background job,
    # which starts with SIGINT ignored (Python then installs no KeyboardInterrupt handler of its own)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args = tyro.cli(Args)
    try:
        main(args)
    except (ValueError, ImportError, BufferInputError, FloatingPointError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
