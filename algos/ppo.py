"""PPO (Schulman et al. 2017, arXiv:1707.06347); results: results/CartPole-v1/ppo.json"""

import copy
import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Annotated

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Categorical, Normal
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import envs
from buffers import BufferInputError, RolloutBuffer, to_torch

ALGO = "ppo"


@dataclass
class Args:
    # --- shared flags (every script) ---
    env_id: Annotated[str, tyro.conf.arg(aliases=("--env",))] = "CartPole-v1"
    """Gymnasium id with Discrete or Box actions (e.g. CartPole-v1, Pendulum-v1); --env is an alias"""
    seed: int = 1
    """seed of numpy, torch and the envs"""
    total_timesteps: int = 500_000
    """env steps, summed over all envs"""
    num_envs: int = 4
    """parallel training envs"""
    cuda: bool = False
    """train on CUDA (an error if no device is available)"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic"""
    torch_threads: int = 1
    """torch CPU threads (0: torch's default); 1 is fastest for small networks beside the envs"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "flashmarl"
    """Weights & Biases project (with --track)"""
    wandb_entity: str | None = None
    """Weights & Biases team or user (with --track)"""
    capture_video: bool = False
    """film the first greedy episode of each evaluation (or of --eval-checkpoint)"""
    save_model: bool = True
    """write last.pt at the end and best.pt at each best evaluation (Ctrl-C always writes last.pt)"""
    eval_interval: int = 10_000
    """env steps between greedy evaluations (0: only at the end)"""
    eval_episodes: int = 10
    """episodes per evaluation"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint greedily and exit"""
    resume: str | None = None
    """continue the run in this run directory from its last.pt"""
    run_dir: str | None = None
    """where to write (default runs/<env>__ppo__<seed>__<time>)"""

    # --- PPO (defaults: CleanRL's ppo.py for CartPole). For Box actions CleanRL's ppo_continuous_action.py
    # uses --learning-rate 3e-4 --num-envs 1 --num-steps 2048 --num-minibatches 32 --update-epochs 10
    # --ent-coef 0 --norm-obs --norm-reward; pass those flags for Pendulum or MuJoCo.
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """linear learning-rate decay to 0"""
    num_steps: int = 128
    """steps per env per rollout"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda (bias-variance trade-off of the advantages)"""
    num_minibatches: int = 4
    """minibatches per update epoch"""
    update_epochs: int = 4
    """passes over each rollout"""
    norm_adv: bool = True
    """advantage normalization per minibatch"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient epsilon"""
    clip_vloss: bool = True
    """value clipping around the old prediction"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip"""
    target_kl: float | None = None
    """stop the update epochs early when the approximate KL exceeds this"""
    hidden_size: int = 64
    """width of the hidden layers"""
    norm_obs: bool = False
    """normalize observations by running mean/std, clipped to +-10 (saved in the checkpoint)"""
    norm_reward: bool = False
    """scale rewards by the running std of the discounted return, clipped to +-10 (training only)"""

    # --- derived at runtime ---
    batch_size: int = field(default=0, init=False)
    """env steps per rollout: num_envs * num_steps"""
    minibatch_size: int = field(default=0, init=False)
    """batch_size // num_minibatches"""
    num_iterations: int = field(default=0, init=False)
    """rollouts in the run: total_timesteps // batch_size"""


def layer_init(layer, std=2**0.5, bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class RunningMeanStd(nn.Module):
    """Running mean and variance (parallel merge of batch moments); buffers, so saved with the weights."""

    def __init__(self, shape=()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    def update(self, x):  # x (N, *shape)
        x = x.to(self.mean)
        batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total


class Agent(nn.Module):
    """Separate tanh actor and critic MLPs; Categorical or diagonal Gaussian (state-independent log-std)."""

    def __init__(self, obs_dim, action_space, args):
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        act_dim = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        h = args.hidden_size

        def mlp(d_out, out_std):
            hidden = [layer_init(nn.Linear(obs_dim, h)), nn.Tanh(), layer_init(nn.Linear(h, h)), nn.Tanh()]
            return nn.Sequential(*hidden, layer_init(nn.Linear(h, d_out), std=out_std))

        self.critic, self.actor = mlp(1, 1.0), mlp(act_dim, 0.01)
        if not self.discrete:
            self.actor_logstd = nn.Parameter(torch.zeros(act_dim))
        self.obs_rms, self.return_rms = RunningMeanStd((obs_dim,)), RunningMeanStd()
        self.register_buffer("norm_obs", torch.tensor(args.norm_obs))  # a checkpoint brings its own setting

    def preprocess(self, obs, device, update=False):
        """Flatten, and with --norm-obs normalize by the running statistics (updated on training steps only)."""
        x = torch.as_tensor(np.asarray(obs), dtype=torch.float32, device=device).flatten(1)
        if not self.norm_obs:
            return x
        if update:
            self.obs_rms.update(x)
        return ((x - self.obs_rms.mean) / torch.sqrt(self.obs_rms.var + 1e-8)).clamp(-10, 10).float()

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def dist(self, x):
        out = self.actor(x)
        return Categorical(logits=out) if self.discrete else Normal(out, self.actor_logstd.exp().expand_as(out))

    def get_action_and_value(self, x, action=None, greedy=False):
        d = self.dist(x)
        if action is None:
            action = (d.probs.argmax(-1) if self.discrete else d.mean) if greedy else d.sample()
        if self.discrete:
            return action, d.log_prob(action), d.entropy(), self.get_value(x)
        return action, d.log_prob(action).sum(-1), d.entropy().sum(-1), self.get_value(x)


def to_env(action, space):
    """Torch actions -> what env.step takes; Gaussian samples are clipped to the Box."""
    a = action.cpu().numpy()
    return a if isinstance(space, gym.spaces.Discrete) else np.clip(a, space.low, space.high).astype(space.dtype)


def make_env(env_id, num_envs, seed, **kwargs):
    """envs.make_gym, with Gymnasium's registry errors turned into one clear message."""
    try:
        return envs.make_gym(env_id, num_envs, seed, **kwargs)
    except (gym.error.UnregisteredEnv, gym.error.DeprecatedEnv) as e:
        raise ValueError(f"unknown env id {env_id!r}: {e} (any registered Gymnasium id, e.g. CartPole-v1)") from None
    except gym.error.DependencyNotInstalled as e:
        raise ImportError(f"{env_id} needs an extra package: {e}") from None


def evaluate(agent, args, device, seed, video_dir=None):
    """Greedy episodes on separate envs, one per env (so short episodes are not favoured)."""
    n = args.eval_episodes
    env = make_env(args.env_id, n, seed, capture_video=video_dir is not None, run_dir=video_dir)
    obs, _ = env.reset()
    returns = np.full(n, np.nan)
    with torch.no_grad():
        while np.isnan(returns).any():
            action = agent.get_action_and_value(agent.preprocess(obs, device), greedy=True)[0]
            obs, _, _, _, infos = env.step(to_env(action, env.single_action_space))
            if "_episode" in infos:
                first = infos["_episode"] & np.isnan(returns)
                returns[first] = infos["episode"]["r"][first]
    env.close()
    return returns


def env_signature(env, env_id):
    """What a checkpoint must match: the observation shape and the action space."""
    space = env.single_action_space
    if isinstance(space, gym.spaces.Discrete):
        action = ["discrete", int(space.n)]
    elif isinstance(space, gym.spaces.Box):
        action = ["box", list(space.shape), space.low.tolist(), space.high.tolist()]
    else:
        raise ValueError(f"ppo.py supports Discrete and Box action spaces, but {env_id} has {space}")
    return {"obs_shape": list(env.single_observation_space.shape), "action_space": action}


def save_checkpoint(path, agent, optimizer, args, signature, global_step, iteration, rng, best_eval):
    """Everything --resume needs, in types that torch.load(weights_only=True) accepts."""
    rngs = {"torch": torch.get_rng_state(), "numpy": rng.bit_generator.state}
    ckpt = dict(algo=ALGO, env_id=args.env_id, signature=signature, args=json.loads(json.dumps(asdict(args))),
                agent=agent.state_dict(), optimizer=optimizer.state_dict(), global_step=global_step,
                best_eval=float(best_eval), iteration=iteration, rng=rngs)  # fmt: skip
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
            f"match {args.env_id} with {signature}: pass the same --env-id"
        )
    if ckpt["args"]["hidden_size"] != args.hidden_size:
        raise ValueError(f"checkpoint {path} was trained with --hidden-size {ckpt['args']['hidden_size']}: pass it")
    return ckpt


def update(agent, optimizer, rb, args, device, rng):
    """PPO epochs: clipped surrogate, clipped value loss, entropy bonus (CleanRL's ppo.py)."""
    clipfracs = []
    for _ in range(args.update_epochs):
        for mb in rb.minibatches(args.num_minibatches, rng):
            mb = to_torch(mb, device)
            _, logprob, entropy, new_v = agent.get_action_and_value(mb["obs"], mb["actions"])
            logratio = logprob - mb["logprobs"]
            ratio = logratio.exp()
            with torch.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()  # the k3 estimator (Schulman's blog)
                clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())
            adv = mb["advantages"]
            if args.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()

            v_loss = (new_v - mb["returns"]) ** 2
            if args.clip_vloss:
                v_clipped = mb["values"] + (new_v - mb["values"]).clamp(-args.clip_coef, args.clip_coef)
                v_loss = torch.max(v_loss, (v_clipped - mb["returns"]) ** 2)
            v_loss = 0.5 * v_loss.mean()
            ent = entropy.mean()
            loss = pg_loss - args.ent_coef * ent + args.vf_coef * v_loss
            if not torch.isfinite(loss):  # stop before the weights are poisoned
                raise FloatingPointError(
                    f"the loss became {loss.item()} (policy {pg_loss.item():.3g}, value {v_loss.item():.3g}); "
                    "lower --learning-rate, or try --norm-obs / --norm-reward"
                )
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
        if args.target_kl is not None and approx_kl > args.target_kl:
            break
    ret, val = rb.targets["returns"], rb["values"]
    explained_var = 0.0 if np.var(ret) == 0 else float(1 - np.var(ret - val) / np.var(ret))
    return dict(policy_loss=pg_loss.item(), value_loss=v_loss.item(), entropy=ent.item(), approx_kl=approx_kl.item(),
                clipfrac=float(np.mean(clipfracs)), explained_variance=explained_var)  # fmt: skip


def main(args):
    if args.cuda and not torch.cuda.is_available():
        raise ValueError("--cuda was given but no CUDA device is available: drop --cuda to train on the CPU")
    device = torch.device("cuda" if args.cuda else "cpu")
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)

    # seeding, envs, networks
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    rng = np.random.default_rng(args.seed)
    env = make_env(args.env_id, args.num_envs, args.seed)
    signature = env_signature(env, args.env_id)
    action_space = env.single_action_space
    agent = Agent(int(np.prod(env.single_observation_space.shape)), action_space, args).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    if args.eval_checkpoint:
        agent.load_state_dict(load_checkpoint(args.eval_checkpoint, args, signature)["agent"])
        video = os.path.join(os.path.dirname(args.eval_checkpoint), "eval") if args.capture_video else None
        returns = evaluate(agent, args, device, args.seed + 10_000, video)
        print(f"{args.env_id} {ALGO} {args.eval_checkpoint}: episodic return {returns.mean():.2f} ± "
              f"{returns.std():.2f} over {len(returns)} greedy episodes"
              + (f"; video in {video}/videos" if video else ""))  # fmt: skip
        return

    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = max(1, args.total_timesteps // args.batch_size)
    global_step, start_iteration = 0, 1
    if args.resume:  # same weights, optimizer moments, step counter and RNG: the curve continues
        run_dir = args.resume
        ckpt = load_checkpoint(os.path.join(run_dir, "last.pt"), args, signature)
        agent.load_state_dict(ckpt["agent"])
        optimizer.load_state_dict(ckpt["optimizer"])
        global_step, start_iteration = ckpt["global_step"], ckpt["iteration"] + 1
        torch.set_rng_state(ckpt["rng"]["torch"])
        rng.bit_generator.state = ckpt["rng"]["numpy"]
    else:
        run_dir = args.run_dir or f"runs/{args.env_id}__{ALGO}__{args.seed}__{int(time.time())}"
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(asdict(args), f, indent=2)
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=asdict(args),
                   name=os.path.basename(run_dir), sync_tensorboard=True)  # fmt: skip
    writer = SummaryWriter(run_dir)
    discrete = isinstance(action_space, gym.spaces.Discrete)
    rb = RolloutBuffer(args.num_steps, args.num_envs, {
        "obs": ((int(np.prod(env.single_observation_space.shape)),), np.float32),  # preprocessed, as the nets see it
        "actions": ((), np.int64) if discrete else (action_space.shape, np.float32),  # unclipped samples
        "logprobs": ((), np.float32),
        "values": ((), np.float32),
        "rewards": ((), np.float32),
        "terminated": ((), np.bool_),
        "truncated": ((), np.bool_),
        "final_values": ((), np.float32),  # V(final observation) where an episode was truncated
    })  # fmt: skip

    def checkpoint(name, step, it, best):
        if args.save_model or name == "last.pt":
            save_checkpoint(os.path.join(run_dir, name), agent, optimizer, args, signature, step, it, rng, best)

    def run_eval(step, it, best):
        """Greedy evaluation on separate envs; keeps best.pt and an optional video."""
        video = os.path.join(run_dir, "eval", f"step_{step}") if args.capture_video else None
        returns = evaluate(agent, args, device, args.seed + 10_000, video)
        writer.add_scalar("eval/episodic_return", returns.mean(), step)
        if returns.mean() > best:
            checkpoint("best.pt", step, it, returns.mean())
        return float(returns.mean()), max(best, float(returns.mean()))

    next_eval = (global_step // args.eval_interval + 1) * args.eval_interval if args.eval_interval else None
    best_eval = ckpt.get("best_eval", -np.inf) if args.resume else -np.inf  # a resumed run keeps best.pt
    last_eval, last_eval_step = float("nan"), -1
    raw_obs, _ = env.reset()
    obs = agent.preprocess(raw_obs, device, update=True)
    discounted = np.zeros(args.num_envs)  # running discounted return, for --norm-reward
    start_time, start_step, iteration = time.time(), global_step, start_iteration - 1
    finished, before_update = iteration, None  # the last finished update; weights while one runs
    bar = tqdm(total=args.num_iterations * args.batch_size, initial=global_step, unit="step", dynamic_ncols=True)
    try:
        for iteration in range(start_iteration, args.num_iterations + 1):
            lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
            optimizer.param_groups[0]["lr"] = lr

            for _ in range(args.num_steps):
                # ACT
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(obs)
                # STEP
                raw_obs, rewards, terminated, truncated, infos = env.step(to_env(action, action_space))
                global_step += args.num_envs
                if args.norm_reward:  # Gymnasium's NormalizeReward, restarted at every episode end
                    discounted = discounted * args.gamma + rewards
                    agent.return_rms.update(torch.as_tensor(discounted))
                    rewards = np.clip(rewards / np.sqrt(agent.return_rms.var.item() + 1e-8), -10, 10)
                    discounted[terminated | truncated] = 0.0
                # STORE: a truncated episode bootstraps from V(final observation), not the next episode's first
                final_values = np.zeros(args.num_envs, dtype=np.float32)
                if cut := np.flatnonzero(truncated & infos.get("_final_obs", False)).tolist():
                    final = np.stack([infos["final_obs"][i] for i in cut])
                    with torch.no_grad():
                        final_values[cut] = agent.get_value(agent.preprocess(final, device)).cpu().numpy()
                rb.add(obs=obs.cpu().numpy(), actions=action.cpu().numpy(), logprobs=logprob.cpu().numpy(),
                       values=value.cpu().numpy(), rewards=rewards, terminated=terminated, truncated=truncated,
                       final_values=final_values)  # fmt: skip
                if "_episode" in infos:  # one point per step: the mean over the episodes that just finished
                    done = infos["_episode"]
                    writer.add_scalar("charts/episodic_return", infos["episode"]["r"][done].mean(), global_step)
                    writer.add_scalar("charts/episodic_length", infos["episode"]["l"][done].mean(), global_step)
                obs = agent.preprocess(raw_obs, device, update=True)

            # TARGETS: GAE (Schulman et al. 2016) over the rollout (a stopped update is undone: see the except below)
            before_update = copy.deepcopy((agent.state_dict(), optimizer.state_dict()))
            with torch.no_grad():
                last_values = agent.get_value(obs).cpu().numpy()
            rb.compute_gae(last_values, args.gamma, args.gae_lambda)
            # UPDATE
            losses = update(agent, optimizer, rb, args, device, rng)
            rb.reset()
            finished, before_update = iteration, None

            # LOG
            for k, v in losses.items():
                writer.add_scalar(f"losses/{k}", v, global_step)
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
        if before_update is not None:
            agent.load_state_dict(before_update[0])
            optimizer.load_state_dict(before_update[1])
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
