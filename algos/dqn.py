"""Double DQN (Mnih et al. 2015; van Hasselt et al. 2016); results: results/CartPole-v1/dqn.json"""

import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from typing import Annotated

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import envs
from buffers import BufferInputError, PrioritizedReplayBuffer, ReplayBuffer, to_torch

ALGO = "dqn"
LOG_EVERY = 100  # env steps between TensorBoard points (CleanRL's dqn.py)


@dataclass
class Args:
    # --- shared flags (every script) ---
    env_id: Annotated[str, tyro.conf.arg(aliases=("--env",))] = "CartPole-v1"
    """Gymnasium id with a Discrete action space; --env is an alias"""
    seed: int = 1
    """seed of numpy, torch and the envs"""
    total_timesteps: int = 500_000
    """env steps, summed over all envs"""
    num_envs: int = 1
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
    save_buffer: bool = True
    """at Ctrl-C, also write the replay buffer to replay.npz, so --resume replays the same data (else it refills)"""
    eval_interval: int = 10_000
    """env steps between greedy evaluations (0: only at the end)"""
    eval_episodes: int = 10
    """episodes per evaluation"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint greedily and exit"""
    resume: str | None = None
    """continue the run in this run directory from its last.pt (and replay.npz, the replay buffer at Ctrl-C)"""
    run_dir: str | None = None
    """where to write (default runs/<env>__dqn__<seed>__<time>)"""

    # --- DQN (defaults: CleanRL's dqn.py for CartPole) ---
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    buffer_size: int = 10_000
    """replay capacity in transitions"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 1.0
    """target update rate: 1 copies the Q-network (hard update), < 1 is a Polyak (soft) update"""
    target_network_frequency: int = 500
    """env steps between target-network updates (use 1 with a small --tau for a soft update every step)"""
    batch_size: int = 128
    """transitions per gradient step"""
    start_e: float = 1.0
    """epsilon at the start of exploration"""
    end_e: float = 0.05
    """epsilon at the end of exploration"""
    exploration_fraction: float = 0.5
    """fraction of --total-timesteps over which epsilon decays linearly from --start-e to --end-e"""
    learning_starts: int = 10_000
    """env steps of experience collected before learning starts"""
    train_frequency: int = 10
    """env steps per gradient step (summed over envs, so the replay ratio does not depend on --num-envs)"""
    dueling: bool = False
    """dueling head: Q = V + A - mean(A) (Wang et al. 2016)"""
    n_step: int = 1
    """n-step returns: bootstrap from the observation n steps later (Sutton 1988; Hessel et al. 2018)"""
    prioritized: bool = False
    """proportional prioritized replay with priorities |TD error| (Schaul et al. 2016)"""
    prioritized_replay_alpha: float = 0.6
    """priority exponent (0: uniform)"""
    prioritized_replay_beta: float = 0.4
    """initial importance-sampling exponent, annealed linearly to 1 over --total-timesteps"""


class QNetwork(nn.Module):
    """CleanRL's 120-84 ReLU MLP; with --dueling a value stream and a mean-centred advantage stream."""

    def __init__(self, obs_dim, n_actions, dueling):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU())
        self.advantage = nn.Linear(84, n_actions)
        self.value = nn.Linear(84, 1) if dueling else None

    def forward(self, x):  # (B, *obs_shape) -> Q (B, n_actions)
        h = self.body(x.flatten(1))
        a = self.advantage(h)
        if self.value is None:
            return a
        return self.value(h) + a - a.mean(-1, keepdim=True)  # Wang et al. 2016, eq. 9


def linear_schedule(start_e, end_e, duration, t):
    slope = (end_e - start_e) / max(duration, 1)
    return max(slope * t + start_e, end_e)


def crossings(step, advanced, every):
    """How many multiples of `every` the step counter passed when it advanced by `advanced` to `step`."""
    return step // every - (step - advanced) // every


def t(x, device):
    return torch.as_tensor(np.asarray(x), dtype=torch.float32, device=device)


def make_env(env_id, num_envs, seed, **kwargs):
    """envs.make_gym, with Gymnasium's registry errors turned into one clear message."""
    try:
        return envs.make_gym(env_id, num_envs, seed, **kwargs)
    except (gym.error.UnregisteredEnv, gym.error.DeprecatedEnv) as e:
        raise ValueError(f"unknown env id {env_id!r}: {e} (any registered Gymnasium id, e.g. CartPole-v1)") from None
    except gym.error.DependencyNotInstalled as e:
        raise ImportError(f"{env_id} needs an extra package: {e}") from None


def evaluate(q_network, args, device, seed, video_dir=None):
    """Greedy episodes (epsilon 0) on separate envs, one per env (so short episodes are not favoured)."""
    n = args.eval_episodes
    env = make_env(args.env_id, n, seed, capture_video=video_dir is not None, run_dir=video_dir)
    obs, _ = env.reset()
    returns = np.full(n, np.nan)
    with torch.no_grad():
        while np.isnan(returns).any():
            obs, _, _, _, infos = env.step(q_network(t(obs, device)).argmax(-1).cpu().numpy())
            if "_episode" in infos:
                first = infos["_episode"] & np.isnan(returns)
                returns[first] = infos["episode"]["r"][first]
    env.close()
    return returns


def env_signature(env, env_id):
    """What a checkpoint must match: the observation shape and the number of actions."""
    space = env.single_action_space
    if not isinstance(space, gym.spaces.Discrete):
        raise ValueError(
            f"dqn needs a discrete action space, but {env_id} has {space}: use ppo.py for continuous actions"
        )
    return {"obs_shape": list(env.single_observation_space.shape), "n_actions": int(space.n)}


def save_checkpoint(path, q_network, target_network, optimizer, args, signature, global_step, rng, best_eval):
    """Everything --resume needs but the replay buffer, in types that torch.load(weights_only=True) accepts."""
    rngs = {"torch": torch.get_rng_state(), "numpy": rng.bit_generator.state}
    ckpt = dict(algo=ALGO, env_id=args.env_id, signature=signature, args=json.loads(json.dumps(asdict(args))),
                q_network=q_network.state_dict(), target_network=target_network.state_dict(),
                optimizer=optimizer.state_dict(), global_step=global_step, best_eval=float(best_eval),
                rng=rngs)  # fmt: skip
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
    if ckpt["args"]["dueling"] != args.dueling:
        raise ValueError(f"checkpoint {path} was trained {'with' if ckpt['args']['dueling'] else 'without'} --dueling")
    return ckpt


def update(q_network, target_network, optimizer, rb, args, device, rng, beta):
    """One gradient step on a replayed batch: Double-DQN n-step targets, importance-weighted squared TD error."""
    if args.prioritized:
        batch = rb.sample(args.batch_size, rng, beta=beta, n_step=args.n_step, gamma=args.gamma)
    else:
        batch = rb.sample(args.batch_size, rng, n_step=args.n_step, gamma=args.gamma)
    if args.n_step == 1:  # n-step sampling returns the bootstrap factor itself: gamma^m, or 0 after a termination
        batch["discounts"] = args.gamma * (1.0 - batch["terminated"])
    mb = to_torch(batch, device)
    # TARGETS: the online network picks the next action, the target network evaluates it (van Hasselt et al. 2016)
    with torch.no_grad():
        next_actions = q_network(mb["next_obs"]).argmax(-1, keepdim=True)
        next_q = target_network(mb["next_obs"]).gather(-1, next_actions).squeeze(-1)
        td_target = mb["rewards"] + mb["discounts"] * next_q
    q = q_network(mb["obs"]).gather(-1, mb["actions"].unsqueeze(-1)).squeeze(-1)
    td_error = td_target - q
    loss = (mb["weights"] * td_error**2).mean() if args.prioritized else (td_error**2).mean()
    if not torch.isfinite(loss):  # stop before the weights are poisoned
        raise FloatingPointError(
            f"the TD loss became {loss.item()} (mean Q {q.mean().item():.3g}); lower --learning-rate, "
            "or check the reward scale"
        )
    # UPDATE
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if args.prioritized:  # new priorities: the TD errors just measured
        rb.update_priorities(batch["indices"], td_error.abs().detach().cpu().numpy())
    return dict(td_loss=loss.item(), q_values=q.mean().item())


def main(args):
    if args.cuda and not torch.cuda.is_available():
        raise ValueError("--cuda was given but no CUDA device is available: drop --cuda to train on the CPU")
    if args.n_step < 1:
        raise ValueError(f"--n-step {args.n_step} must be >= 1")
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
    obs_shape, n_actions = env.single_observation_space.shape, signature["n_actions"]
    q_network = QNetwork(int(np.prod(obs_shape)), n_actions, args.dueling).to(device)
    target_network = QNetwork(int(np.prod(obs_shape)), n_actions, args.dueling).to(device)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)

    if args.eval_checkpoint:
        q_network.load_state_dict(load_checkpoint(args.eval_checkpoint, args, signature)["q_network"])
        video = os.path.join(os.path.dirname(args.eval_checkpoint), "eval") if args.capture_video else None
        returns = evaluate(q_network, args, device, args.seed + 10_000, video)
        print(f"{args.env_id} {ALGO} {args.eval_checkpoint}: episodic return {returns.mean():.2f} ± "
              f"{returns.std():.2f} over {len(returns)} greedy episodes"
              + (f"; video in {video}/videos" if video else ""))  # fmt: skip
        return

    global_step = 0
    if args.resume:  # same weights, optimizer moments, step counter and RNG; the replay buffer below
        run_dir = args.resume
        ckpt = load_checkpoint(os.path.join(run_dir, "last.pt"), args, signature)
        q_network.load_state_dict(ckpt["q_network"])
        target_network.load_state_dict(ckpt["target_network"])
        optimizer.load_state_dict(ckpt["optimizer"])
        global_step = ckpt["global_step"]
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
    fields = {
        "obs": (obs_shape, np.float32),
        "next_obs": (obs_shape, np.float32),  # the episode's final observation where it ended
        "actions": ((), np.int64),
        "rewards": ((), np.float32),
        "terminated": ((), np.bool_),  # only termination zeroes the bootstrap
        "truncated": ((), np.bool_),  # a time limit ends the n-step window but still bootstraps
    }
    if args.prioritized:
        rb = PrioritizedReplayBuffer(args.buffer_size, args.num_envs, fields, alpha=args.prioritized_replay_alpha)
    else:
        rb = ReplayBuffer(args.buffer_size, args.num_envs, fields)

    def checkpoint(name, step, best):
        if args.save_model or name == "last.pt":
            save_checkpoint(os.path.join(run_dir, name), q_network, target_network, optimizer, args, signature,
                            step, rng, best)  # fmt: skip

    def run_eval(step, best):
        """Greedy evaluation on separate envs; keeps best.pt and an optional video."""
        video = os.path.join(run_dir, "eval", f"step_{step}") if args.capture_video else None
        returns = evaluate(q_network, args, device, args.seed + 10_000, video)
        writer.add_scalar("eval/episodic_return", returns.mean(), step)
        if returns.mean() > best:
            checkpoint("best.pt", step, returns.mean())
        return float(returns.mean()), max(best, float(returns.mean()))

    next_eval = (global_step // args.eval_interval + 1) * args.eval_interval if args.eval_interval else None
    best_eval = ckpt.get("best_eval", -np.inf) if args.resume else -np.inf  # a resumed run keeps best.pt
    last_eval, last_eval_step = float("nan"), -1
    train_start = global_step + args.learning_starts  # after a resume without replay.npz the buffer refills
    replay_file = os.path.join(run_dir, "replay.npz")
    if args.resume and os.path.exists(replay_file):
        rb.load(replay_file)
        train_start = global_step
        print(f"resumed with the {len(rb)} transitions of {replay_file}")
    losses = {}
    obs, _ = env.reset()
    start_time, start_step = time.time(), global_step
    bar = tqdm(total=args.total_timesteps, initial=global_step, unit="step", dynamic_ncols=True)
    try:
        while global_step < args.total_timesteps:
            # ACT: epsilon-greedy with a linearly decaying epsilon
            epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps,
                                      global_step)  # fmt: skip
            with torch.no_grad():
                greedy = q_network(t(obs, device)).argmax(-1).cpu().numpy()
            explore = rng.random(args.num_envs) < epsilon
            actions = np.where(explore, rng.integers(n_actions, size=args.num_envs), greedy)
            # STEP
            next_obs, rewards, terminated, truncated, infos = env.step(actions)
            global_step += args.num_envs
            # STORE: the final observation of a finished episode, not the first of the next one
            real_next_obs = next_obs.copy()
            for i in np.flatnonzero(infos.get("_final_obs", [])):
                real_next_obs[i] = infos["final_obs"][i]
            rb.add(obs=obs, next_obs=real_next_obs, actions=actions, rewards=rewards, terminated=terminated,
                   truncated=truncated)  # fmt: skip
            if "_episode" in infos:  # one point per step: the mean over the episodes that just finished
                done = infos["_episode"]
                writer.add_scalar("charts/episodic_return", infos["episode"]["r"][done].mean(), global_step)
                writer.add_scalar("charts/episodic_length", infos["episode"]["l"][done].mean(), global_step)
            obs = next_obs

            # TARGETS and UPDATE: one gradient step per --train-frequency env steps
            if global_step > train_start and len(rb) >= args.batch_size:
                beta = args.prioritized_replay_beta + (1.0 - args.prioritized_replay_beta) * min(
                    1.0, global_step / args.total_timesteps
                )
                for _ in range(crossings(global_step, args.num_envs, args.train_frequency)):
                    losses = update(q_network, target_network, optimizer, rb, args, device, rng, beta)
                if crossings(global_step, args.num_envs, args.target_network_frequency):
                    for p, tp in zip(q_network.parameters(), target_network.parameters(), strict=True):
                        tp.data.copy_(args.tau * p.data + (1.0 - args.tau) * tp.data)

            # LOG
            bar.update(args.num_envs)
            if crossings(global_step, args.num_envs, LOG_EVERY):
                for k, v in losses.items():
                    writer.add_scalar(f"losses/{k}", v, global_step)
                sps = int((global_step - start_step) / (time.time() - start_time))
                writer.add_scalar("charts/SPS", sps, global_step)
                writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                writer.add_scalar("charts/epsilon", epsilon, global_step)
                bar.set_postfix(SPS=sps, eval=f"{last_eval:.2f}")

            # EVAL
            if next_eval is not None and global_step >= next_eval:
                next_eval += args.eval_interval
                last_eval, best_eval = run_eval(global_step, best_eval)
                last_eval_step = global_step
    except (KeyboardInterrupt, FloatingPointError) as e:
        bar.close()
        checkpoint("last.pt", global_step, best_eval)
        if args.save_buffer:
            rb.save(replay_file)
        writer.close()
        if isinstance(e, FloatingPointError):
            raise FloatingPointError(f"{e}; saved {run_dir}/last.pt (the weights before the bad update)") from None
        saved = f"{run_dir}/last.pt" + (f" and {replay_file}" if args.save_buffer else "")
        print(f"interrupted at step {global_step}: saved {saved}; continue with --resume {run_dir}")
        sys.exit(130)
    bar.close()

    if last_eval_step != global_step:
        last_eval, best_eval = run_eval(global_step, best_eval)
    checkpoint("last.pt", global_step, best_eval)
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
