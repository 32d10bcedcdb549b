"""Can MAPPO learn the relations of probes/spread_inputs.py itself (issue 46)? mappo.py with its networks' first layer
replaced by an encoder over simple_spread's entities, everything else (PPO, flags, trunk, heads) unchanged.

    python probes/spread_encoder.py --env-kwargs '{"N": 6}' --total-timesteps 3000000 --run-dir /tmp/encoder6
    (any mappo.py flag but --rnn and --no-share-params; --env-id is simple_spread_v3)

The actor's first layer becomes: each landmark and each other agent a token (its position relative to the agent, the
squared length of it, and its kind), one layer of self-attention among the tokens (a landmark's token can find the
agents near it: a dot product of [p, |p|^2, 1] features can express -|p_l - p_j|^2), then attention pooling with the
agent's own features (velocity, position, id) as the query; its output feeds the trunk as the first layer's did.
The critic encodes each agent's observation (the state is their concatenation) the same way, with its own weights,
and adds the mean over the agents. Both are invariant to the order of the landmarks and of the other agents.

If this reaches what the relational inputs reach, an entity encoder is the fix to build into the scripts.

    python probes/spread_encoder.py --cost     # the price: one forward and backward pass, encoder against plain MLP

On one CPU core (2026-11-27, beside three other runs) the encoder took 16.8 s per pass over a rollout at N = 6, the
plain network 0.080 s (210x): with 20 passes per update and 937 updates, a 3M-step run would take days. It is a probe
for a machine with a GPU (add --cuda).
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


class CriticEntities(nn.Module):
    """(B, A, 6N [+ A ids]) every agent's observation -> (B, A, h): each encoded, plus the mean over the agents."""

    def __init__(self, n_agents: int, extra: int, h: int):
        super().__init__()
        self.encode, self.team = Entities(n_agents, extra, h), nn.Linear(h, h)

    def forward(self, x):
        e = self.encode(x)
        return e + self.team(e.mean(-2, keepdim=True))


class EntityPolicy(mappo.Policy):
    def __init__(self, spec, state_dim, args):
        super().__init__(spec, state_dim, args)
        A, h, ids = spec.n_agents, args.hidden_size, spec.n_agents if self.with_id else 0
        self.actor.fc, self.critic.fc = Entities(A, ids, h), CriticEntities(A, ids, h)

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
    for name, net in (("encoder", Entities(n_agents, n_agents, 64)), ("plain", plain)):
        start = time.perf_counter()
        for _ in range(repeats):
            net(x).sum().backward()
        result[name] = (time.perf_counter() - start) / repeats
    return result


if __name__ == "__main__":
    if sys.argv[1:] == ["--cost"]:
        seconds = cost()
        print(
            f"one pass over a rollout at N = 6 (128 envs x 25 steps x 6 agents), forward and backward, one thread: "
            f"encoder {seconds['encoder']:.2f} s, plain MLP {seconds['plain']:.3f} s "
            f"({seconds['encoder'] / seconds['plain']:.0f}x)"
        )
        sys.exit(0)
    if any(a.startswith(("--env-id", "--env_id", "--rnn", "--no-share-params", "--no-share_params")) for a in sys.argv):
        sys.exit("error: this probe trains on simple_spread_v3 with shared feed-forward networks only")
    sys.argv[1:1] = ["--env-id", "simple_spread_v3"]
    mappo.Policy = EntityPolicy
    mappo.fast_acting = lambda x, net: False  # the compiled acting pass knows the plain layers only
    cli(mappo.Args, mappo.main)
