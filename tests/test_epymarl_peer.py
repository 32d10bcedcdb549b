"""results/epymarl_peer.py: EPyMARL's saved agent rebuilt and played on our protocol (issue 42, part 4).

EPyMARL itself is not installed here; what these tests hold is what our side does with what it writes: the agent
rebuilt from its state dict, its inputs laid out as EPyMARL's basic controller lays them out, its env key and the
metrics sacred logs, and the one-line errors of the command.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "results"))
import epymarl_peer  # noqa: E402


def agent_state(d_in: int, hidden: int, n_actions: int, gru: bool) -> dict[str, torch.Tensor]:
    """The keys and shapes of the agent.th EPyMARL's RNNAgent saves (a GRUCell or a Linear in the middle)."""
    torch.manual_seed(0)
    middle = torch.nn.GRUCell(hidden, hidden) if gru else torch.nn.Linear(hidden, hidden)
    layers = {"fc1": torch.nn.Linear(d_in, hidden), "rnn": middle, "fc2": torch.nn.Linear(hidden, n_actions)}
    return {f"{name}.{k}": v for name, layer in layers.items() for k, v in layer.state_dict().items()}


def passthrough(d_in: int, n_actions: int) -> dict[str, torch.Tensor]:
    """An agent (Linear middle) that passes its non-negative inputs to fc2, whose weights (zero here) read them."""
    eye, zeros = torch.eye(d_in), torch.zeros(d_in)
    state = {"fc1.weight": eye, "fc1.bias": zeros, "rnn.weight": eye.clone(), "rnn.bias": zeros.clone()}
    return state | {"fc2.weight": torch.zeros(n_actions, d_in), "fc2.bias": torch.zeros(n_actions)}


def test_the_agent_is_rebuilt_from_its_saved_state_dict(tmp_path):
    for gru in (True, False):
        state = agent_state(14, 32, 6, gru)
        torch.save(state, tmp_path / "agent.th")
        agent = epymarl_peer.EPyMARLAgent(torch.load(tmp_path / "agent.th", weights_only=True))
        assert isinstance(agent.rnn, torch.nn.GRUCell) == gru and agent.fc2.out_features == 6
        x, h = torch.randn(5, 14), torch.randn(5, 32)
        hidden = torch.relu(x @ state["fc1.weight"].T + state["fc1.bias"])
        if gru:
            (i_r, i_z, i_n), (h_r, h_z, h_n) = (  # torch's GRUCell: its gates r, z, n stacked in this order
                (hidden @ state["rnn.weight_ih"].T + state["rnn.bias_ih"]).chunk(3, -1),
                (h @ state["rnn.weight_hh"].T + state["rnn.bias_hh"]).chunk(3, -1),
            )
            r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
            hidden = (1 - z) * torch.tanh(i_n + r * h_n) + z * h
        else:  # use_rnn False: a Linear and a ReLU, the hidden state unused
            hidden = torch.relu(hidden @ state["rnn.weight"].T + state["rnn.bias"])
        out, h_next = agent(x, h)
        torch.testing.assert_close(h_next, hidden)
        torch.testing.assert_close(out, hidden @ state["fc2.weight"].T + state["fc2.bias"])


def test_the_agents_inputs_are_epymarls_observation_last_action_and_id_and_reset_at_an_episodes_end():
    # an agent that shows what it was fed: fc1 and the middle Linear pass the inputs through, fc2 reads them
    obs_dim, n_actions, n_agents = 3, 4, 2
    d_in = obs_dim + n_actions + n_agents
    state = passthrough(d_in, n_actions)
    for agent_id in range(n_agents):  # the id one-hot after the last action: agent i prefers action i
        state["fc2.weight"][agent_id, obs_dim + n_actions + agent_id] = 1.0
    for action in range(n_actions):  # the last action's one-hot after the observation: it outweighs the id
        state["fc2.weight"][(action + 2) % n_actions, obs_dim + action] = 2.0
    agent = epymarl_peer.EPyMARLAgent(state)
    act = epymarl_peer.acting(agent, last_action=True, agent_id=True)(num_envs=3, rng=None)
    obs = SimpleNamespace(obs={"agent": np.zeros((3, n_agents, obs_dim), np.float32)})
    first = act(obs, None)["agent"]
    assert first.tolist() == [[0, 1]] * 3  # no last action yet: each agent's id decides
    second = act(obs, np.zeros(3, bool))["agent"]
    assert second.tolist() == [[2, 3]] * 3  # the last action (0, 1) decides: (0 + 2, 1 + 2)
    third = act(obs, np.array([False, True, False]))["agent"]
    assert third.tolist() == [[0, 1], [0, 1], [0, 1]]  # env 1 started anew (id only); the others followed (2, 3)
    # without the last action (qmix.yaml's and mappo.yaml's obs_last_action False) the id follows the observation
    d_in = obs_dim + n_agents
    state = passthrough(d_in, n_actions)
    for agent_id in range(n_agents):
        state["fc2.weight"][n_actions - 1 - agent_id, obs_dim + agent_id] = 1.0
    act = epymarl_peer.acting(epymarl_peer.EPyMARLAgent(state), last_action=False, agent_id=True)(3, None)
    assert act(obs, None)["agent"].tolist() == act(obs, np.zeros(3, bool))["agent"].tolist() == [[3, 2]] * 3


def test_the_benchmark_tasks_map_to_epymarls_env_keys_and_other_envs_are_refused():
    assert epymarl_peer.package_key("Foraging-2s-8x8-2p-2f-coop") == ("lbforaging:Foraging-2s-8x8-2p-2f-coop-v3", 50)
    assert epymarl_peer.package_key("rware-tiny-4ag") == ("rware:rware-tiny-4ag-v2", 500)
    with pytest.raises(ValueError, match="'simple_spread_v3' is not a task of the EPyMARL benchmark here.*rware-tiny"):
        epymarl_peer.package_key("simple_spread_v3")


def test_sacreds_metrics_are_read_as_logged():
    pickled = {"dtype": "float64", "py/object": "numpy.float64", "value": 0.5}
    steps, values = epymarl_peer.series({"test_return_mean": [pickled, 1.0], "test_return_mean_T": [50, 1050]},
                                        "test_return_mean")  # fmt: skip
    assert steps.tolist() == [50, 1050] and values.tolist() == [0.5, 1.0]


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--env-id", "simple_spread_v3"], "is not a task of the EPyMARL benchmark here"),
        (["--env-id", "rware-tiny-2ag", "--epymarl", "/nonexistent"], "no src/main.py there"),
        (["--env-id", "rware-tiny-2ag", "--python", "/nonexistent/python"], "not an executable interpreter"),
        (["--env-id", "rware-tiny-2ag", "--seeds", "0"], "a count N needs N >= 1"),
        (["--env-id", "rware-tiny-2ag", "--eval-interval", "0"], "must be positive"),
    ],
)
def test_bad_flags_get_one_line(tmp_path, capsys, flags, says):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("")
    base = {"--epymarl": str(tmp_path), "--python": sys.executable, "--total-timesteps": "1000"}
    base |= dict(zip(flags[::2], flags[1::2], strict=True))
    with pytest.raises(SystemExit) as exit_:
        epymarl_peer.main([x for kv in base.items() for x in kv] + ["--out", str(tmp_path / "out")])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


FAKE_MAIN = '''"""A stand-in for EPyMARL's src/main.py: what a finished run leaves behind, where EPyMARL leaves it."""
import json, sys
from pathlib import Path
import torch
flags = dict(a.split("=", 1) for a in sys.argv[sys.argv.index("with") + 1 :])
key, seed, t_max = flags["env_args.key"], int(flags["seed"]), int(flags["t_max"])
sacred = Path(__file__).resolve().parent.parent / "results" / "sacred" / "qmix" / key / str(seed + 1)
sacred.mkdir(parents=True)
config = {"seed": seed, "name": "qmix", "obs_last_action": False, "obs_agent_id": True, "lr": 0.0005,
          "local_results_path": flags["local_results_path"], "env_args": {"key": key}}
(sacred / "config.json").write_text(json.dumps(config))
(sacred / "run.json").write_text(json.dumps({"status": "COMPLETED"}))
steps = list(range(50, t_max + 51, int(flags["test_interval"])))
info = {"test_return_mean": [{"py/object": "numpy.float64", "value": 0.1 * i} for i in range(len(steps))],
        "test_return_mean_T": steps}
(sacred / "info.json").write_text(json.dumps(info))
torch.manual_seed(seed)
layers = {"fc1": torch.nn.Linear(12 + 2, 8), "rnn": torch.nn.Linear(8, 8), "fc2": torch.nn.Linear(8, 6)}
state = {f"{n}.{k}": v for n, layer in layers.items() for k, v in layer.state_dict().items()}
for t in (0, t_max + 50):
    model = Path(flags["local_results_path"]) / "models" / f"qmix_seed{seed}" / str(t)
    model.mkdir(parents=True)
    torch.save(state, model / "agent.th")
'''


def test_a_peer_run_is_played_on_our_episodes_and_collected_as_a_row(tmp_path):
    import collect

    epymarl = tmp_path / "epymarl"
    (epymarl / "src").mkdir(parents=True)
    (epymarl / "src" / "main.py").write_text(FAKE_MAIN)
    out = tmp_path / "results"
    flags = ["--epymarl", str(epymarl), "--python", sys.executable, "--env-id", "Foraging-8x8-2p-2f-coop", "--seeds",
             "0,1", "--total-timesteps", "1000", "--eval-interval", "500", "--out", str(out)]  # fmt: skip
    assert epymarl_peer.main(flags) == 0
    result = collect.read_json(out / "Foraging-8x8-2p-2f-coop" / "qmix-epymarl.json")
    assert collect.result_errors(result) == [] and result["seeds"] == [0, 1]
    for entry in result["per_seed"]:
        # EPyMARL's tests (the team's sum: 0, 0.1, 0.2) as our mean over the 2 agents, at EPyMARL's steps
        assert entry["evaluations"] == {"steps": [50, 550, 1050], "returns": [0.0, 0.05, 0.1]}
        final = entry["final_policy"]
        assert final["episodes"] == 1000 and final["protocol"] == "v2"
        assert entry["command"].endswith(f"--seeds {entry['seed']},")  # reruns that seed alone
    assert result["config"]["epymarl"]["lr"] == 0.0005 and "local_results_path" not in result["config"]["epymarl"]
    run_dir = out / "runs" / "Foraging-8x8-2p-2f-coop" / "qmix-epymarl" / "seed1"
    assert collect.read_json(run_dir / "final_eval.json")["global_step"] == 1050  # the agent saved last
    assert epymarl_peer.main(flags) == 0  # finished seeds are skipped, the row written again
