"""Can MAPPO learn the relations that --relations computes (envs/relations.py) itself (issue 46)? mappo.py with its
networks' first layer replaced by an encoder over simple_spread's entities, everything else (PPO, flags, trunk, heads)
unchanged.

    python probes/spread_encoder.py --env-kwargs '{"N": 6}' --total-timesteps 3000000 --run-dir /tmp/encoder6
    (any mappo.py flag but --rnn and --no-share-params; --env-id is simple_spread_v3)

The actor's first layer becomes: each landmark and each other agent a token (its position relative to the agent, the
squared length of it, and its kind), one layer of self-attention among the tokens (a landmark's token can find the
agents near it: a dot product of [p, |p|^2, 1] features can express -|p_l - p_j|^2), then attention pooling with the
agent's own features (velocity, position, id) as the query; its output feeds the trunk as the first layer's did.
The critic encodes each agent's observation (the state is their concatenation) the same way, with its own weights,
and adds the mean over the agents. Both are invariant to the order of the landmarks and of the other agents.

If this reaches what the relational inputs reach, an entity encoder is the fix to build into the scripts.

    python probes/spread_encoder.py --cost     # the price: one forward and backward pass, each encoder against the MLP
    python probes/spread_encoder.py --encoder pairs ...      # the learned relation layer (Pairs) in place of attention

On one CPU core (2026-11-27, beside three other runs) one pass over a rollout at N = 6 took 16.8-19.6 s with the
attention encoder, 4.7 s with the relation layer and 0.08-0.13 s with the plain network (150-210x and 36x): with 20
passes per update and 937 updates, a 3M-step run would take one to several days. Both are probes for a machine with
a GPU (add --cuda).
"""

import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "algos"))

import mappo  # noqa: E402  (the checkout's own script)

from runtime import cli  # noqa: E402


class Entities(nn.Module):
    """(B, A, 6N [+ A ids]) simple_spread observations (normalized) -> (B, A, h)."""

    def __init__(self, n_agents: int, extra: int, h: int, heads: int = 4):
        super().__init__()
        self.n = n_agents
        self.own = nn.Linear(4 + extra, h)  # velocity, position, [agent id]
        self.token = nn.Linear(2 + 1 + 2, h)  # relative position, its squared length, landmark or agent
        self.mix = nn.TransformerEncoderLayer(h, heads, dim_feedforward=2 * h, dropout=0.0, batch_first=True)
        self.pool = nn.MultiheadAttention(h, heads, batch_first=True)
        kinds = torch.zeros(2 * n_agents - 1, 2)
        kinds[:n_agents, 0], kinds[n_agents:, 1] = 1.0, 1.0
        self.register_buffer("kinds", kinds, persistent=False)

    def forward(self, x):
        N, lead = self.n, x.shape[:-1]
        own = torch.cat([x[..., :4], x[..., 6 * N :]], -1)  # after the 6N observation: the id, if any
        points = x[..., 4 : 4 + 4 * N - 2].unflatten(-1, (2 * N - 1, 2))  # N landmarks, then N - 1 agents
        features = [points, points.square().sum(-1, keepdim=True), self.kinds.expand(*lead, -1, -1)]
        tokens = self.mix(self.token(torch.cat(features, -1)).flatten(0, -3))  # (B*A, 2N - 1, h)
        query = self.own(own).reshape(-1, 1, tokens.shape[-1])
        pooled = self.pool(query, tokens, tokens, need_weights=False)[0]
        return (query + pooled).view(*lead, -1)


class Pairs(nn.Module):
    """(B, A, 6N [+ A ids]) simple_spread observations (normalized) -> (B, A, h), a learned relation layer: an MLP on
    each (landmark, agent) pair (the landmark's position relative to the agent and to the other agent, its distance to
    each, whether the other agent is this one), max-pooled over the agents for each landmark, then mean- and
    max-pooled over the landmarks, beside the agent's own features. It can learn --relations' relations (the
    nearest other agent's distance is a max over pairs) at a fraction of attention's cost."""

    def __init__(self, n_agents: int, extra: int, h: int, width: int = 32):
        super().__init__()
        self.n = n_agents
        self.own = nn.Linear(4 + extra, h)
        self.pair = nn.Sequential(nn.Linear(7, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.out = nn.Linear(2 * width, h)
        self.register_buffer("is_self", torch.eye(1, n_agents).view(n_agents, 1), persistent=False)

    def forward(self, x):
        N = self.n
        own = torch.cat([x[..., :4], x[..., 6 * N :]], -1)
        marks = x[..., 4 : 4 + 2 * N].unflatten(-1, (N, 2))  # (..., N landmarks, 2), relative to the agent
        others = x[..., 4 + 2 * N : 4 + 4 * N - 2].unflatten(-1, (N - 1, 2))
        agents = torch.cat([torch.zeros_like(others[..., :1, :]), others], -2)  # the agent itself first, at 0
        gap = marks.unsqueeze(-3) - agents.unsqueeze(-2)  # (..., agents j, landmarks l, 2): landmark l from agent j
        features = [
            marks.unsqueeze(-3).expand_as(gap),
            gap,
            gap.norm(dim=-1, keepdim=True),
            marks.norm(dim=-1, keepdim=True).unsqueeze(-3).expand(*gap.shape[:-1], 1),
            self.is_self.expand(*gap.shape[:-1]).unsqueeze(-1),
        ]
        per_landmark = self.pair(torch.cat(features, -1)).amax(-3)  # over the agents: (..., N, width)
        pooled = torch.cat([per_landmark.mean(-2), per_landmark.amax(-2)], -1)
        return self.own(own) + self.out(pooled)


class CriticEntities(nn.Module):
    """(B, A, 6N [+ A ids]) every agent's observation -> (B, A, h): each encoded, plus the mean over the agents."""

    def __init__(self, n_agents: int, extra: int, h: int, encoder=None):
        super().__init__()
        self.encode, self.team = (encoder or Entities)(n_agents, extra, h), nn.Linear(h, h)

    def forward(self, x):
        e = self.encode(x)
        return e + self.team(e.mean(-2, keepdim=True))


ENCODER = Entities  # --encoder attention (default) or pairs


class EntityPolicy(mappo.Policy):
    def __init__(self, spec, state_dim, args):
        super().__init__(spec, state_dim, args)
        A, h, ids = spec.n_agents, args.hidden_size, spec.n_agents if self.with_id else 0
        self.actor.fc, self.critic.fc = ENCODER(A, ids, h), CriticEntities(A, ids, h, ENCODER)

    def critic_values(self, state, hx=None, keep=None):  # the state is the agents' observations, concatenated
        obs = self.state_norm(state.flatten(1)).unflatten(-1, (self.spec.n_agents, -1))
        v, hx = self.critic(self._with_id(obs), hx, keep)
        return v.squeeze(-1), hx


def cost(n_agents: int = 6, envs: int = 128, steps: int = 25, repeats: int = 2) -> dict:
    """Seconds of one forward and backward pass over one rollout (--num-envs x --num-steps samples of every agent, one
    torch thread), for the actor's encoder and for mappo.py's plain network: a PPO update makes 10 such passes of
    the actor and 10 of the critic."""
    torch.set_num_threads(1)
    x = torch.randn(envs * steps, n_agents, 6 * n_agents + n_agents)
    plain = nn.Sequential(nn.Linear(x.shape[-1], 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    result = {}
    encoders = (("attention", Entities(n_agents, n_agents, 64)), ("pairs", Pairs(n_agents, n_agents, 64)))
    for name, net in (*encoders, ("plain", plain)):
        start = time.perf_counter()
        for _ in range(repeats):
            net(x).sum().backward()
        result[name] = (time.perf_counter() - start) / repeats
    return result


if __name__ == "__main__":
    if sys.argv[1:] == ["--cost"]:
        seconds = cost()
        plain = seconds["plain"]
        print(
            f"one pass over a rollout at N = 6 (128 envs x 25 steps x 6 agents), forward and backward, one thread: "
            f"attention {seconds['attention']:.2f} s ({seconds['attention'] / plain:.0f}x), pairs "
            f"{seconds['pairs']:.2f} s ({seconds['pairs'] / plain:.1f}x), plain MLP {plain:.3f} s"
        )
        sys.exit(0)
    if "--encoder" in sys.argv:  # this probe's own flag, before mappo.py's
        at = sys.argv.index("--encoder")
        choice = sys.argv[at + 1] if at + 1 < len(sys.argv) else ""
        if choice not in ("attention", "pairs"):
            sys.exit(f"error: --encoder {choice!r}: expected attention or pairs")
        ENCODER = Pairs if choice == "pairs" else Entities
        del sys.argv[at : at + 2]
    if any(a.startswith(("--env-id", "--env_id", "--rnn", "--no-share-params", "--no-share_params")) for a in sys.argv):
        sys.exit("error: this probe trains on simple_spread_v3 with shared feed-forward networks only")
    sys.argv[1:1] = ["--env-id", "simple_spread_v3"]
    mappo.Policy = EntityPolicy
    mappo.fast_acting = lambda x, net: False  # the compiled acting pass knows the plain layers only
    group_layer = mappo.per_agent  # the encoders take the (B, A, d) rows themselves
    mappo.per_agent = lambda layer, x: group_layer(layer, x) if isinstance(layer, mappo.GroupLinear) else layer(x)
    cli(mappo.Args, mappo.main)
