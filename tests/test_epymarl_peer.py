"""results/epymarl_peer.py: EPyMARL's saved agent rebuilt and played on our protocol (issue 42, part 4).

EPyMARL itself is not installed here; what these tests hold is what our side does with what it writes: the agent
rebuilt from its state dict, its inputs laid out as EPyMARL's basic controller lays them out, its env key and the
metrics sacred logs, and the one-line errors of the command.
"""

import os
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
    assert epymarl_peer.package_key("Foraging-5x5-2p-1f") == ("lbforaging:Foraging-5x5-2p-1f-v3", 50)  # any task
    with pytest.raises(ValueError, match="'simple_spread_v3' is not a Level-Based Foraging or .*rware-tiny"):
        epymarl_peer.package_key("simple_spread_v3")


def test_sacreds_metrics_are_read_as_logged():
    pickled = {"dtype": "float64", "py/object": "numpy.float64", "value": 0.5}
    steps, values = epymarl_peer.series({"test_return_mean": [pickled, 1.0], "test_return_mean_T": [50, 1050]},
                                        "test_return_mean")  # fmt: skip
    assert steps.tolist() == [50, 1050] and values.tolist() == [0.5, 1.0]


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--env-id", "simple_spread_v3"], "is not a Level-Based Foraging or Multi-Robot Warehouse task"),
        (["--env-id", "rware-tiny-2ag", "--epymarl", "/nonexistent"], "no src/main.py there"),
        (["--env-id", "rware-tiny-2ag", "--python", "/nonexistent/python"], "not an executable interpreter"),
        (["--env-id", "rware-tiny-2ag", "--python", "/"], "not an executable interpreter"),  # a folder: X_OK alone
        (["--env-id", "rware-tiny-2ag", "--seeds", "0"], "a count N needs N >= 1"),
        (["--env-id", "rware-tiny-2ag", "--eval-interval", "0"], "must be positive"),
        (["--env-id", "rware-tiny-2ag", "--keep-every", "0"], "and --keep-every must be positive"),
        (["--env-id", "rware-tiny-2ag", "--variant", "5m/x"], "use letters, digits, '-' and '_' only"),
        (["--env-id", "rware-tiny-2ag", "--extend", ""], "--extend '': name a row, as <config>-epymarl-<variant>"),
        (["--env-id", "rware-tiny-2ag", "--extend", "../x"], "--extend '../x': name a row"),
        (["--env-id", "rware-tiny-2ag", "--config", "qmx"], "--config qmx: EPyMARL has no "),
    ],
)
def test_bad_flags_get_one_line(tmp_path, capsys, flags, says):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("")
    (tmp_path / "src" / "config" / "algs").mkdir(parents=True)
    (tmp_path / "src" / "config" / "algs" / "qmix.yaml").write_text("")
    base = {"--epymarl": str(tmp_path), "--python": sys.executable, "--total-timesteps": "1000"}
    base |= dict(zip(flags[::2], flags[1::2], strict=True))
    with pytest.raises(SystemExit) as exit_:
        epymarl_peer.main([x for kv in base.items() for x in kv] + ["--out", str(tmp_path / "out")])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


FAKE_MAIN = '''"""A stand-in for EPyMARL's src/main.py run through epymarl_launch.py: what a run leaves behind,
where EPyMARL leaves it. With FAKE_STOP_AT set it stops there, saved, as the launcher does on a signal; given
checkpoint_path and load_step it resumes from that save."""
import json, os, sys
from datetime import datetime
from pathlib import Path
import torch
flags = dict(a.split("=", 1) for a in sys.argv[sys.argv.index("with") + 1 :])
key, seed, t_max = flags["env_args.key"], int(flags["seed"]), int(flags["t_max"])
root = Path(__file__).resolve().parent.parent / "results" / "sacred" / "qmix" / key
root.mkdir(parents=True, exist_ok=True)
sacred = root / str(len(list(root.iterdir())) + 1)  # sacred numbers its runs by arrival
sacred.mkdir()
start = int(flags.get("load_step", 0))
if os.environ.get("FAKE_FAIL"):
    raise RuntimeError(os.environ["FAKE_FAIL"])
if flags.get("checkpoint_path"):  # the driver keeps only the save it resumes from
    assert sorted(os.listdir(flags["checkpoint_path"])) == [str(start)], os.listdir(flags["checkpoint_path"])
stop = int(os.environ.get("FAKE_STOP_AT", t_max + 50))
config = {"seed": seed, "name": "qmix", "obs_last_action": False, "obs_agent_id": True, "lr": 0.0005,
          "local_results_path": flags["local_results_path"], "env_args": {"key": key},
          "checkpoint_path": flags.get("checkpoint_path", ""), "load_step": start}
(sacred / "config.json").write_text(json.dumps(config))
grid = list(range(50, t_max + 51, int(flags["test_interval"])))  # the tests' steps, as if never stopped
tests = [i for i, t in enumerate(grid) if start < t <= stop]
info = {"test_return_mean": [{"py/object": "numpy.float64", "value": 0.1 * i} for i in tests],
        "test_return_mean_T": [grid[i] for i in tests]}
(sacred / "info.json").write_text(json.dumps(info))
now = datetime.now().isoformat()
status = "INTERRUPTED" if stop <= t_max else "COMPLETED"
(sacred / "run.json").write_text(json.dumps({"status": status, "start_time": now, "stop_time": now}))
torch.manual_seed(seed)
layers = {"fc1": torch.nn.Linear(12 + 2, 8), "rnn": torch.nn.Linear(8, 8), "fc2": torch.nn.Linear(8, 6)}
state = {f"{n}.{k}": v for n, layer in layers.items() for k, v in layer.state_dict().items()}
token = f"qmix_seed{seed}_{key}_{now}"  # EPyMARL's unique_token: a new one per run
for t in ([0] if start == 0 else []) + [min(stop, t_max + 50)]:
    model = Path(flags["local_results_path"]) / "models" / token / str(t)
    model.mkdir(parents=True)
    torch.save(state, model / "agent.th")
sys.exit(75 if status == "INTERRUPTED" else 0)
'''


def fake_epymarl(tmp_path: Path, monkeypatch) -> Path:
    epymarl = tmp_path / "epymarl"
    (epymarl / "src").mkdir(parents=True)
    (epymarl / "src" / "main.py").write_text(FAKE_MAIN)
    (epymarl / "src" / "config" / "algs").mkdir(parents=True)
    (epymarl / "src" / "config" / "algs" / "qmix.yaml").write_text("")  # the config the fake stands in for
    monkeypatch.setattr(epymarl_peer, "LAUNCHER", epymarl / "src" / "main.py")
    return epymarl


def test_a_peer_run_is_played_on_our_episodes_and_collected_as_a_row(tmp_path, monkeypatch):
    import collect

    epymarl = fake_epymarl(tmp_path, monkeypatch)
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


def test_a_variant_is_a_row_of_its_own_beside_the_configs_row(tmp_path, monkeypatch):
    import collect

    epymarl = fake_epymarl(tmp_path, monkeypatch)
    out = tmp_path / "results"
    flags = ["--epymarl", str(epymarl), "--python", sys.executable, "--env-id", "Foraging-8x8-2p-2f-coop", "--seeds",
             "0,", "--eval-interval", "500", "--out", str(out)]  # fmt: skip
    assert epymarl_peer.main(flags + ["--total-timesteps", "1000"]) == 0
    assert epymarl_peer.main(flags + ["--total-timesteps", "500", "--variant", "short"]) == 0
    task = out / "Foraging-8x8-2p-2f-coop"
    full, short = (collect.read_json(task / f"qmix-epymarl{v}.json") for v in ("", "-short"))
    assert (full["algo"], full["total_timesteps"]) == ("qmix-epymarl", 1000)
    assert (short["algo"], short["total_timesteps"]) == ("qmix-epymarl-short", 500)  # its own runs, not the 1000's
    assert short["per_seed"][0]["evaluations"]["steps"] == [50, 550]
    assert (out / "runs" / "Foraging-8x8-2p-2f-coop" / "qmix-epymarl-short" / "seed0" / "final_eval.json").is_file()


def test_a_failed_epymarl_run_is_said_with_the_exception_it_ended_on(tmp_path, monkeypatch, capsys):
    epymarl = fake_epymarl(tmp_path, monkeypatch)
    flags = ["--epymarl", str(epymarl), "--python", sys.executable, "--env-id", "Foraging-8x8-2p-2f-coop", "--seeds",
             "0,", "--total-timesteps", "1000", "--out", str(tmp_path / "results")]  # fmt: skip
    monkeypatch.setenv("FAKE_FAIL", "a CUDA error, say")
    assert epymarl_peer.main(flags) == 1
    assert "error: EPyMARL exited with 1 (RuntimeError: a CUDA error, say): see " in capsys.readouterr().err


def test_a_seed_another_command_holds_is_skipped_and_each_row_holds_every_finished_seed(tmp_path, monkeypatch, capsys):
    import collect
    import run

    epymarl = fake_epymarl(tmp_path, monkeypatch)
    out = tmp_path / "results"
    flags = ["--epymarl", str(epymarl), "--python", sys.executable, "--env-id", "Foraging-8x8-2p-2f-coop",
             "--total-timesteps", "1000", "--eval-interval", "500", "--out", str(out)]  # fmt: skip
    runs = out / "runs" / "Foraging-8x8-2p-2f-coop" / "qmix-epymarl"
    held = run.claim(runs / "seed0")  # another command trains seed 0 (flock: per open, so it holds)
    assert isinstance(held, int)
    assert epymarl_peer.main(flags + ["--seeds", "0,1"]) == 0
    assert f"skip Foraging-8x8-2p-2f-coop qmix-epymarl seed 0: in use by another sweep (pid {os.getpid()})" in (
        capsys.readouterr().out
    )
    assert not (runs / "seed0").exists() and collect.is_finished(runs / "seed1")  # seed 0's directory untouched
    row = out / "Foraging-8x8-2p-2f-coop" / "qmix-epymarl.json"
    assert collect.read_json(row)["seeds"] == [1]
    os.close(held)  # the other command ends; a third one, naming seed 0 alone, trains it
    assert epymarl_peer.main(flags + ["--seeds", "0,"]) == 0
    assert collect.read_json(row)["seeds"] == [0, 1]  # seed 1, which this command did not name, is in its row


def test_a_stopped_seed_resumes_from_its_save_and_its_row_joins_the_segments(tmp_path, monkeypatch, capsys):
    import collect

    epymarl = fake_epymarl(tmp_path, monkeypatch)
    out = tmp_path / "results"
    flags = ["--epymarl", str(epymarl), "--python", sys.executable, "--env-id", "Foraging-8x8-2p-2f-coop", "--seeds",
             "0,", "--total-timesteps", "1000", "--eval-interval", "500", "--out", str(out)]  # fmt: skip
    run_dir = out / "runs" / "Foraging-8x8-2p-2f-coop" / "qmix-epymarl" / "seed0"
    monkeypatch.setenv("FAKE_STOP_AT", "500")  # EPyMARL stops at step 500, saved there
    assert epymarl_peer.main(flags) == epymarl_peer.STOPPED
    assert "the same command resumes seed 0 from its save" in capsys.readouterr().err
    assert [t for t, _ in epymarl_peer.saves(run_dir)] == [0, 500] and not collect.is_finished(run_dir)
    monkeypatch.delenv("FAKE_STOP_AT")
    assert epymarl_peer.main(flags) == 0  # the fake checks that it was handed the save at 500, and it alone
    assert [t for t, _ in epymarl_peer.saves(run_dir)] == [500, 1050]
    (entry,) = collect.read_json(out / "Foraging-8x8-2p-2f-coop" / "qmix-epymarl.json")["per_seed"]
    assert entry["evaluations"] == {"steps": [50, 550, 1050], "returns": [0.0, 0.05, 0.1]}  # as if never stopped
    record = collect.read_json(run_dir / epymarl_peer.RECORD_NAME)
    assert [(s["from_step"], s["status"]) for s in record["segments"]] == [(0, "INTERRUPTED"), (500, "COMPLETED")]
    assert "load_step=500" in record["epymarl_command"]
    assert collect.read_json(run_dir / "final_eval.json")["global_step"] == 1050


def test_a_longer_row_goes_on_from_a_shorter_rows_last_save_and_joins_its_segments(tmp_path, monkeypatch, capsys):
    """--extend: seed 0 of a 1000-step row starts from the 500-step row's save at its end, not from step 0; the
    row's tests and segments are the shorter row's and then its own, as if it had never stopped."""
    import collect

    epymarl = fake_epymarl(tmp_path, monkeypatch)
    out = tmp_path / "results"
    flags = ["--epymarl", str(epymarl), "--python", sys.executable, "--env-id", "Foraging-8x8-2p-2f-coop", "--seeds",
             "0,", "--eval-interval", "500", "--out", str(out)]  # fmt: skip
    longer = flags + ["--total-timesteps", "1000", "--extend", "qmix-epymarl-short"]
    assert epymarl_peer.main(longer) == 1  # nothing to go on from yet
    assert "--extend qmix-epymarl-short: seed 0 has no finished run there" in capsys.readouterr().err
    assert epymarl_peer.main(flags + ["--total-timesteps", "500", "--variant", "short"]) == 0  # ends saved at 550
    assert epymarl_peer.main(longer) == 0  # the fake checks that it was handed the save at 550, and it alone
    assert "extending qmix-epymarl-short's seed 0 from its last save, at step 550" in capsys.readouterr().out
    (entry,) = collect.read_json(out / "Foraging-8x8-2p-2f-coop" / "qmix-epymarl.json")["per_seed"]
    assert entry["evaluations"] == {"steps": [50, 550, 1050], "returns": [0.0, 0.05, 0.1]}
    run_dir = out / "runs" / "Foraging-8x8-2p-2f-coop" / "qmix-epymarl" / "seed0"
    record = collect.read_json(run_dir / epymarl_peer.RECORD_NAME)
    assert [(s["from_step"], s["status"]) for s in record["segments"]] == [(0, "COMPLETED"), (550, "COMPLETED")]
    assert collect.read_json(run_dir / "config.json")["extends"] == "qmix-epymarl-short"
    shorter = out / "runs" / "Foraging-8x8-2p-2f-coop" / "qmix-epymarl-short" / "seed0"
    assert collect.is_finished(shorter) and [t for t, _ in epymarl_peer.saves(shorter)] == [0, 550]  # left as it was
    again = flags + ["--total-timesteps", "500", "--variant", "x", "--extend"]
    assert epymarl_peer.main(again + ["qmix-epymarl-short"]) == 1
    assert "ran 500 steps, as many as --total-timesteps 500 or more: nothing to extend" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        epymarl_peer.main(again + ["qmix-epymarl-x"])
    assert "--extend qmix-epymarl-x: that is this row" in capsys.readouterr().err


def test_keep_every_keeps_a_save_in_each_span_through_resumes_and_plays_each_at_the_end(tmp_path, monkeypatch):
    """A resume removes every save but the newest (newest_save_only): --keep-every keeps the first save of each span
    of steps out of its reach, and the seed's end plays each kept agent on the fixed episodes (kept_evals.json)."""
    import collect

    import runtime.evaluation

    epymarl = fake_epymarl(tmp_path, monkeypatch)
    monkeypatch.setattr(runtime.evaluation, "FINAL_EPISODES", 20)  # fewer of the fixed episodes: the same code path
    out = tmp_path / "results"
    flags = ["--epymarl", str(epymarl), "--python", sys.executable, "--env-id", "Foraging-8x8-2p-2f-coop", "--seeds",
             "0,", "--total-timesteps", "1000", "--eval-interval", "500", "--out", str(out),
             "--keep-every", "400"]  # fmt: skip
    run_dir = out / "runs" / "Foraging-8x8-2p-2f-coop" / "qmix-epymarl" / "seed0"
    monkeypatch.setenv("FAKE_STOP_AT", "300")  # saves at 0 and 300: the same span of 400, the first kept
    assert epymarl_peer.main(flags) == epymarl_peer.STOPPED
    monkeypatch.setenv("FAKE_STOP_AT", "500")  # resumes from 300 (removing 0, kept), saves at 500: a span of its own
    assert epymarl_peer.main(flags) == epymarl_peer.STOPPED
    monkeypatch.delenv("FAKE_STOP_AT")
    assert epymarl_peer.main(flags) == 0  # from 500 (300 removed: its span was kept at 0) to the end, 1050
    assert [t for t, _ in epymarl_peer.saves(run_dir)] == [500, 1050]
    assert sorted(int(p.name) for p in (run_dir / "kept").iterdir()) == [0, 500, 1050]
    kept = collect.read_json(run_dir / epymarl_peer.KEPT_EVALS_NAME)
    assert (kept["protocol"], kept["episodes"], kept["every"]) == ("v2", 20, 400)
    assert [e["global_step"] for e in kept["evaluations"]] == [0, 500, 1050]
    final = collect.read_json(run_dir / "final_eval.json")  # the last kept agent is the final one: the same returns
    assert kept["evaluations"][-1]["mean"] == final["mean"] and final["global_step"] == 1050
    assert epymarl_peer.keep_saves(run_dir, 400) == [0, 500, 1050]  # kept once: calling it again adds nothing
    row = collect.read_json(out / "Foraging-8x8-2p-2f-coop" / "qmix-epymarl.json")  # the row keeps them: the runs go
    collect.check_result(row)
    assert row["per_seed"][0]["kept_policies"] == {"episodes": 20, "evaluations": kept["evaluations"]}
    (run_dir / collect.KEPT_EVALS_NAME).write_text('{"protocol": "v2", "episodes": 20, "evaluations": [{"mean": 1}]}')
    with pytest.raises(collect.CollectError, match="kept_evals.json: not a protocol v2 evaluation of kept saves"):
        collect.seed_metrics(run_dir)


def test_segments_chain_in_the_order_they_ran_and_a_restart_replaces_what_it_repeats(tmp_path):
    import json

    root = tmp_path / "results" / "sacred" / "qmix" / "key"

    def segment(n, minute, from_step, tests, status="INTERRUPTED", seed=0, path="/runs/seed0"):
        folder = root / str(n)
        folder.mkdir(parents=True)
        config = {"seed": seed, "local_results_path": path, "checkpoint_path": "/saves" if from_step else "",
                  "load_step": from_step}  # fmt: skip
        # killed: a heartbeat and no stop_time
        run = {"status": status, "start_time": f"2026-11-29T10:{minute:02d}:00",
               "heartbeat": f"2026-11-29T10:{minute + 1:02d}:30"}  # fmt: skip
        info = {"test_return_mean": [float(t) for t in tests], "test_return_mean_T": tests}
        for name, value in (("config", config), ("run", run), ("info", info)):
            (folder / f"{name}.json").write_text(json.dumps(value))

    segment(1, 0, 0, [50, 550])  # killed before its first save
    segment(2, 2, 0, [50, 550, 1050])  # started again from scratch: replaces 1
    segment(3, 4, 1000, [1050, 1550])  # resumed from its save at 1000
    segment(4, 6, 900, [950, 1450, 1950], "COMPLETED")  # resumed from an earlier save (3's was lost): replaces 3
    segment(5, 8, 0, [50], seed=1)  # another seed
    segment(6, 9, 0, [50], path="/runs/elsewhere")  # another run directory
    chain = epymarl_peer.sacred_segments(tmp_path, "qmix", "key", 0, Path("/runs/seed0"))
    assert [(c["dir"].name, c["from_step"], c["wall_s"]) for c in chain] == [("2", 0, 90.0), ("4", 900, 90.0)]
    steps, values = epymarl_peer.chained_series(chain, "test_return_mean")
    assert steps.tolist() == [50, 550, 950, 1450, 1950]  # 2's test at 1050 is past the save that 4 resumed from
    assert values.tolist() == [50.0, 550.0, 950.0, 1450.0, 1950.0]
    none = epymarl_peer.sacred_segments(tmp_path, "qmix", "key", 0, Path("runs/seed0"))  # not the path it recorded
    assert none == [] and [a.tolist() for a in epymarl_peer.chained_series(none, "test_return_mean")] == [[], []]


def test_a_signal_to_the_driver_reaches_epymarl_as_sigterm_and_reads_as_stopped(tmp_path):
    import signal
    import subprocess
    import threading
    import time

    ready, got = tmp_path / "ready", tmp_path / "got"
    child = (f"import pathlib, signal, sys, time\n"
             f"def stop(signum, frame):\n    pathlib.Path({str(got)!r}).write_text(str(signum)); sys.exit(75)\n"
             f"signal.signal(signal.SIGTERM, stop)\n"
             f"pathlib.Path({str(ready)!r}).touch()\ntime.sleep(60)\n")  # fmt: skip
    before = signal.getsignal(signal.SIGINT)
    proc = subprocess.Popen([sys.executable, "-c", child], start_new_session=True)

    def ctrl_c():  # once the child listens and the driver passes signals on
        while not ready.exists() or signal.getsignal(signal.SIGINT) is before:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    with pytest.raises(epymarl_peer.Stopped, match="exit status 75"):
        epymarl_peer.wait_passing_on_signals(proc)
    assert got.read_text() == str(int(signal.SIGTERM)) and signal.getsignal(signal.SIGINT) is before


STUB_EPYMARL = {  # the parts of EPyMARL's src/ that epymarl_launch.py hooks, reduced to what it touches
    "components/__init__.py": "",
    "components/episode_buffer.py": """
from types import SimpleNamespace
import torch
class ReplayBuffer:
    def __init__(self, n):
        data, episode = {"obs": torch.zeros(n, 3, 2)}, {"s0": torch.zeros(n, 2)}
        self.data = SimpleNamespace(transition_data=data, episode_data=episode)
        self.buffer_size, self.buffer_index, self.episodes_in_buffer = n, 0, 0
""",
    "learners/__init__.py": """
import torch
class RunningMeanStd:
    def __init__(self):
        self.mean, self.var, self.count = torch.zeros(1), torch.ones(1), 1e-4
class MAC:
    def __init__(self):
        self.agent = torch.nn.Linear(2, 2)
class Learner:
    def __init__(self):
        self.mac, self.target_mac, self.target_mixer = MAC(), MAC(), torch.nn.Linear(3, 1)
        self.rew_ms, self.training_steps, self.last_target_update_step = RunningMeanStd(), 0, 0
    def save_models(self, path):
        torch.save(self.mac.agent.state_dict(), f"{path}/agent.th")
    def load_models(self, path):  # as EPyMARL's: the target network becomes a copy of the agent
        self.mac.agent.load_state_dict(torch.load(f"{path}/agent.th", weights_only=True))
        self.target_mac.agent.load_state_dict(self.mac.agent.state_dict())
REGISTRY = {"q_learner": Learner, "also_q": Learner}
""",
    "runners/__init__.py": """
class Runner:
    def __init__(self, args):
        self.args, self.t_env, self.closed = args, 0, False
    def run(self, test_mode=False):
        return "episode"
    def close_env(self):
        self.closed = True
REGISTRY = {"episode": Runner}
""",
}


STUB_PACKAGES = {name.split("/")[0] for name in STUB_EPYMARL}


@pytest.fixture
def launcher(tmp_path, monkeypatch):
    """results/epymarl_launch.py imported in a checkout of stub EPyMARL modules, its hooks installed."""
    import importlib.util

    for name, text in STUB_EPYMARL.items():
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    path, before = sys.path[:], set(sys.modules)
    spec = importlib.util.spec_from_file_location("epymarl_launch_under_test", epymarl_peer.LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        module.install_hooks()
        yield module
    finally:
        sys.path[:] = path
        # the stubs and the launcher only, never a module of torch's: torch registers its operators once a process
        for name in set(sys.modules) - before:
            if name.split(".")[0] in {*STUB_PACKAGES, spec.name}:
                del sys.modules[name]


def test_the_launchers_saves_bring_back_what_epymarls_own_checkpoint_loses(launcher, tmp_path):
    from components.episode_buffer import ReplayBuffer
    from learners import REGISTRY

    torch.manual_seed(0)
    buffer, learner = ReplayBuffer(4), REGISTRY["q_learner"]()
    buffer.data.transition_data["obs"][:3] = torch.randn(3, 3, 2)
    buffer.data.episode_data["s0"][:3] = torch.randn(3, 2)
    buffer.buffer_index = buffer.episodes_in_buffer = 3
    for net in (learner.target_mac.agent, learner.target_mixer):
        torch.nn.init.normal_(net.weight)
    learner.rew_ms.mean, learner.rew_ms.count = torch.tensor([2.0]), 7.0
    learner.training_steps, learner.last_target_update_step = 11, 10
    older, save = tmp_path / "models" / "token" / "50", tmp_path / "models" / "token" / "100"
    for folder in (older, save):
        folder.mkdir(parents=True)
        learner.save_models(folder)
    assert not (older / launcher.STATE_NAME).exists()  # only the newest save keeps the buffer
    fresh_buffer, fresh = ReplayBuffer(4), REGISTRY["also_q"]()  # a resumed run's, built anew
    fresh.load_models(save)
    for a, b in ((fresh.target_mac.agent, learner.target_mac.agent), (fresh.target_mixer, learner.target_mixer)):
        torch.testing.assert_close(a.state_dict(), b.state_dict())  # not the agent's copy EPyMARL's load makes
    assert (fresh.rew_ms.mean.item(), fresh.rew_ms.count) == (2.0, 7.0)
    assert (fresh.training_steps, fresh.last_target_update_step) == (11, 10)
    assert (fresh_buffer.buffer_index, fresh_buffer.episodes_in_buffer) == (3, 3)
    torch.testing.assert_close(fresh_buffer.data.transition_data["obs"], buffer.data.transition_data["obs"])
    torch.testing.assert_close(fresh_buffer.data.episode_data["s0"], buffer.data.episode_data["s0"])


def test_the_launcher_saves_at_a_signal_and_at_the_end_of_training(launcher, tmp_path):
    from learners import REGISTRY
    from runners import REGISTRY as RUNNERS

    REGISTRY["q_learner"]()
    runner = RUNNERS["episode"](SimpleNamespace(local_results_path=str(tmp_path), unique_token="token"))
    runner.t_env = 1234
    assert runner.run() == "episode" and not (tmp_path / "models").exists()
    launcher.stop_requested.append("signal 15")
    assert runner.run(test_mode=True) == "episode"  # a test episode runs on; training stops at its next episode
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert (tmp_path / "models" / "token" / "1234" / launcher.STATE_NAME).is_file()
    runner.t_env = 2000
    runner.close_env()
    assert runner.closed and (tmp_path / "models" / "token" / "2000" / "agent.th").is_file()
    launcher.stop_requested.clear()
    launcher.PARENT_PID = -1  # the driver is gone: the run saves and stops as on a signal
    runner.t_env = 2100
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert launcher.stop_requested == ["the driver's end"] and (tmp_path / "models" / "token" / "2100").is_dir()
