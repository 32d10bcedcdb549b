"""results/: the sweep runner, collection into JSON, the schema check and README regeneration.

Fake algorithm scripts (tests/fake_algos/) stand in for algos/*.py: they take the same flags and
write real TensorBoard events with a known curve, eval = offset + slope * step / T + 0.5 * seed,
so the expected numbers are recomputed here from that formula. Everything writes into tmp dirs.
"""

import concurrent.futures
import copy
import fcntl
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
FAKES = Path(__file__).resolve().parent / "fake_algos"
sys.path.insert(0, str(RESULTS))
sys.path.insert(0, str(FAKES))

import _fake  # noqa: E402
import collect  # noqa: E402
import make_readme  # noqa: E402
import run as sweep_runner  # noqa: E402

TOTAL = 1000
FAKE_CURVES = {"fake_a": (-20.0, 10.0), "fake_b": (-30.0, 20.0)}  # (offset, slope) as in fake_*.py


def run_cli(out: Path, *flags: str, launch_log: Path | None = None, timeout: float = 180):
    """Run results/run.py on the fake scripts in a subprocess."""
    env = dict(os.environ)
    if launch_log is not None:
        env["FAKE_LAUNCH_LOG"] = str(launch_log)
    cmd = [sys.executable, str(RESULTS / "run.py"), "--algos-dir", str(FAKES), "--out", str(out)]
    cmd += ["--envs", "env_x", "--total-timesteps", str(TOTAL), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def launches(path: Path) -> list[list[str]]:
    """The lines the fake scripts appended to the launch log (algo, env, seed, pid)."""
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def approx6(x):
    """Result files round floats to 6 decimals."""
    return pytest.approx(x, abs=1e-6)


def expected_seed(algo: str, seed: int) -> tuple[float, float]:
    """(final = mean of the last 10 of 20 evaluations, best) of a fake run, from its formula."""
    offset, slope = FAKE_CURVES[algo]
    steps = [i * TOTAL // _fake.NUM_EVALS for i in range(1, _fake.NUM_EVALS + 1)]
    values = [_fake.eval_return(s, TOTAL, seed, offset, slope) for s in steps]
    return float(np.mean(values[-10:])), max(values)


def expected_final(algo: str, seed: int) -> float:
    """A fake run's final policy's return (final_eval.json), from its formula."""
    return _fake.final_policy_return(TOTAL, TOTAL, seed, *FAKE_CURVES[algo])


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """One local sweep: 2 fake algorithms x 2 seeds, 2 workers, an extra flag."""
    out = tmp_path_factory.mktemp("sweep")
    log = out / "launches.txt"
    proc = run_cli(
        out,
        "--algos",
        "fake_a,fake_b",
        "--seeds",
        "2",
        "--workers",
        "2",
        "--extra",
        "--num-envs 4",
        launch_log=log,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc, log


def load(out: Path, algo: str) -> dict:
    return json.loads((out / "env_x" / f"{algo}.json").read_text())


# ---------------------------------------------------------------------------------------------------
# Statistics and small helpers
# ---------------------------------------------------------------------------------------------------


def test_iqm_drops_a_quarter_from_each_end():
    assert collect.iqm(np.array([1.0, 2.0, 100.0])) == pytest.approx(103.0 / 3)  # n < 4: the mean
    assert collect.iqm(np.array([-50.0, 1.0, 2.0, 3.0, 90.0])) == pytest.approx(2.0)  # n=5: drop 1 each end
    x = np.array([8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0])  # n=8: drop 2 each end -> mean(3, 4, 5, 6)
    assert collect.iqm(x) == pytest.approx(4.5)
    assert collect.iqm(np.stack([x, x + 1]), axis=-1) == pytest.approx([4.5, 5.5])


def test_bootstrap_ci_is_seeded_and_brackets_the_statistic():
    x = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    low, high = collect.bootstrap_ci(x, np.mean)
    assert (low, high) == collect.bootstrap_ci(x, np.mean)
    assert low < x.mean() < high and low >= x.min() and high <= x.max()
    assert collect.bootstrap_ci(x, np.mean, seed=1) != (low, high)
    assert collect.bootstrap_ci([3.0], collect.iqm) == (3.0, 3.0)
    summary = collect.summarize([1.0, None, 3.0])
    assert summary["n"] == 2 and summary["mean"] == 2.0 and summary["std"] == pytest.approx(np.sqrt(2.0))
    assert collect.summarize([None]) is None


def test_curve_on_grid_interpolates_and_does_not_invent_early_points():
    grid = collect.curve_grid(100, points=5)
    assert grid.tolist() == [0, 25, 50, 75, 100]
    y = collect.curve_on_grid(np.array([20, 60]), np.array([0.0, 4.0]), grid)
    assert np.isnan(y[0]) and y[1:].tolist() == [0.5, 3.0, 4.0, 4.0]
    summary = collect.curve_summary(np.stack([y, y + 2.0]))
    assert summary["mean"][0] is None and summary["mean"][1] == 1.5 and summary["std"][1] == pytest.approx(np.sqrt(2))


def test_parse_seeds():
    assert sweep_runner.parse_seeds("5") == [0, 1, 2, 3, 4]
    assert sweep_runner.parse_seeds("1,3") == [1, 3]
    assert sweep_runner.parse_seeds("3,") == [3]
    with pytest.raises(Exception, match="distinct"):
        sweep_runner.parse_seeds("1,1")
    with pytest.raises(Exception, match="seed 0 alone: --seeds 0,"):  # a count of 0 is a mistake for seed 0
        sweep_runner.parse_seeds("0")


def test_dry_run_prints_the_exact_commands(tmp_path, capsys):
    argv = ["--algos", "fake_a", "--envs", "env_x", "--seeds", "2,", "--total-timesteps", "7"]
    argv += ["--algos-dir", str(FAKES), "--out", str(tmp_path), "--extra", "--num-envs 4", "--dry-run"]
    assert sweep_runner.main(argv) == 0
    expected = (
        f"python tests/fake_algos/fake_a.py --env-id env_x --seed 2 --total-timesteps 7 "
        f"--run-dir {tmp_path.resolve()}/runs/env_x/fake_a/seed2 --num-envs 4"
    )
    assert capsys.readouterr().out.strip() == expected
    assert not (tmp_path / "runs").exists()


def test_extra_takes_a_lone_flag_as_its_value(tmp_path, capsys):
    """`--extra --rnn` passes --rnn to the scripts, as `--extra=--rnn` does (argparse alone stops at it)."""
    argv = ["--algos", "fake_a", "--envs", "env_x", "--seeds", "0,", "--total-timesteps", "7", "--dry-run"]
    argv += ["--algos-dir", str(FAKES), "--out", str(tmp_path)]
    commands = []
    for extra in (["--extra", "--fast"], ["--extra=--fast"], ["--extra", "--fast --num-envs 4"]):
        assert sweep_runner.main([*argv, *extra]) == 0
        commands.append(capsys.readouterr().out.strip())
    assert commands[0] == commands[1] and commands[0].endswith("/seed0 --fast")
    assert commands[2].endswith("/seed0 --fast --num-envs 4")
    with pytest.raises(SystemExit):  # --extra with nothing after it is still argparse's error
        sweep_runner.main([*argv, "--extra"])
    assert "expected one argument" in capsys.readouterr().err


def test_variant_labels_the_run_directories_and_rejects_path_characters(tmp_path, capsys):
    argv = ["--algos", "fake_a", "--envs", "env_x", "--seeds", "1", "--total-timesteps", "7", "--dry-run"]
    argv += ["--algos-dir", str(FAKES), "--out", str(tmp_path), "--extra=--fast"]
    assert sweep_runner.main([*argv, "--variant", "fast"]) == 0
    expected = f"--run-dir {tmp_path.resolve()}/runs/env_x/fake_a-fast/seed0 --fast"
    assert capsys.readouterr().out.strip().endswith(expected)
    with pytest.raises(SystemExit):
        sweep_runner.main([*argv, "--variant", "../x"])
    assert "letters, digits" in capsys.readouterr().err


def test_variant_sweep_collects_under_its_label(tmp_path):
    proc = run_cli(tmp_path, "--algos", "fake_a", "--seeds", "1", "--workers", "1", "--variant", "v2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert load(tmp_path, "fake_a-v2")["algo"] == "fake_a-v2"
    assert (tmp_path / "runs" / "env_x" / "fake_a-v2" / "seed0" / "DONE").exists()


def test_unknown_algorithm_fails_before_running_anything(tmp_path):
    argv = ["--algos", "fake_a,nope", "--envs", "env_x", "--total-timesteps", "7"]
    with pytest.raises(SystemExit, match=r"no script .*nope\.py.*fake_a"):
        sweep_runner.main([*argv, "--algos-dir", str(FAKES), "--out", str(tmp_path)])
    assert not (tmp_path / "runs").exists()


def test_an_env_id_no_script_knows_fails_before_running_anything(tmp_path, capsys):
    argv = ["--algos", "iql,ppo", "--total-timesteps", "7", "--out", str(tmp_path), "--dry-run"]
    known = "CartPole-PO-v1,simple_spread_v3,rware-medium-2ag,mpe2.simple_v3:parallel_env"  # ours, Gymnasium's, a path
    assert sweep_runner.main([*argv, "--envs", known]) == 0
    with pytest.raises(SystemExit):
        sweep_runner.main([*argv, "--envs", f"{known},Foragin-8x8-2p-2f,Foraging-4x4-2p-1f"])
    err = capsys.readouterr().err
    assert "--envs: 'Foragin-8x8-2p-2f' is not an env id of envs.make (envs.known_ids()), nor a Gymnasium id" in err
    assert "'Foraging-4x4-2p-1f' is outside the Level-Based Foraging tasks here" in err
    assert not (tmp_path / "runs").exists()


def test_reader_handles_torch_summary_writer(tmp_path):
    """The real scripts log through torch's SummaryWriter; a rewritten step keeps its last value."""
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    writer = tensorboard.SummaryWriter(str(tmp_path))
    for step, value in [(10, 1.0), (20, 2.0), (30, 3.0)]:
        writer.add_scalar("eval/episodic_return", value, step)
    time.sleep(0.01)
    writer.add_scalar("eval/episodic_return", 5.0, 30)
    writer.add_scalar("charts/SPS", 123.0, 30)
    writer.close()
    scalars = collect.read_scalars(tmp_path)
    steps, values, _ = scalars["eval/episodic_return"]
    assert steps.tolist() == [10, 20, 30] and values.tolist() == [1.0, 2.0, 5.0]
    metrics, _ = collect.seed_metrics(tmp_path)
    assert metrics["final_eval_return"] == pytest.approx(8.0 / 3) and metrics["sps"] == 123.0


def test_execute_sends_files_back_only_from_another_filesystem(tmp_path):
    """A Ray worker that cannot see the driver's launch record returns the run directory's files."""
    run_dir = tmp_path / "seed0"
    argv = ["python", str(FAKES / "fake_a.py"), "--env-id", "env_x", "--seed", "0"]
    argv += ["--total-timesteps", "100", "--run-dir", str(run_dir)]
    spec = {"argv": argv, "cwd": str(ROOT), "run_dir": str(run_dir), "launch_id": "abc", "timeout": 60}
    spec.update(env={}, record={"command": "x"})
    record, files = sweep_runner.execute(spec)  # no launch record: as on another node
    assert record["status"] == "ok" and record["returncode"] == 0 and record["command"] == "x"
    assert {"config.json", "DONE", "run.log"} <= set(files) and any("tfevents" in f for f in files)
    assert files["DONE"] == b""
    shutil.rmtree(run_dir)
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"launch_id": "abc"}))
    record, files = sweep_runner.execute(spec)  # the driver's own directory
    assert record["status"] == "ok" and files is None


def test_a_run_records_the_commit_it_was_launched_from(tmp_path, monkeypatch):
    """A sweep of hours outlives commits: each run names the code it ran, not the code the sweep began with."""
    run_dir = tmp_path / "seed0"
    argv = ["python", str(FAKES / "fake_a.py"), "--env-id", "env_x", "--seed", "0"]
    argv += ["--total-timesteps", "100", "--run-dir", str(run_dir)]
    spec = {"argv": argv, "cwd": str(ROOT), "run_dir": str(run_dir), "launch_id": "abc", "timeout": 60}
    spec.update(env={}, record={"command": "x", "commit": "sweep-start"})
    monkeypatch.setattr(sweep_runner, "git_commit", lambda: "at-launch")
    assert sweep_runner.execute(spec)[0]["commit"] == "at-launch"
    monkeypatch.setattr(sweep_runner, "git_commit", lambda: "unknown")  # a node without the checkout
    assert sweep_runner.execute(spec)[0]["commit"] == "sweep-start"


# ---------------------------------------------------------------------------------------------------
# A local sweep end to end
# ---------------------------------------------------------------------------------------------------


def test_local_sweep_collects_valid_results(local_sweep):
    out, proc, log = local_sweep
    assert "4 ran, 0 skipped, 0 failed" in proc.stdout
    assert sorted((a, s) for a, _, s, _ in launches(log)) == [(a, s) for a in ["fake_a", "fake_b"] for s in "01"]
    for algo in FAKE_CURVES:
        result = load(out, algo)
        assert collect.result_errors(result) == []
        assert (result["algo"], result["env_id"], result["seeds"]) == (algo, "env_x", [0, 1])
        assert result["total_timesteps"] == TOTAL and result["commit"] != "unknown"
        assert "mean over agents" in result["reward_convention"]
        for entry in result["per_seed"]:
            final, best = expected_seed(algo, entry["seed"])
            assert entry["final_eval_return"] == approx6(final)
            assert entry["best_eval_return"] == approx6(best)
            assert entry["num_evals"] == 20 and entry["last_eval_step"] == TOTAL
            evaluations = entry["evaluations"]  # every one, as logged: EPyMARL's metrics are computed from them
            assert len(evaluations["steps"]) == len(evaluations["returns"]) == 20
            assert evaluations["steps"][-1] == TOTAL and max(evaluations["returns"]) == approx6(best)
            assert np.mean(evaluations["returns"][-collect.LAST_N_EVALS :]) == approx6(final)
            assert entry["final_eval_return_by_group"] == {"agent": approx6(final)}
            assert entry["sps"] == 1000.0 + 10 * entry["seed"] and entry["wall_time_s"] > 0
            assert entry["command"] == (
                f"python tests/fake_algos/{algo}.py --env-id env_x --seed {entry['seed']} --total-timesteps "
                f"{TOTAL} --run-dir {out.resolve()}/runs/env_x/{algo}/seed{entry['seed']} --num-envs 4"
            )
            assert (out / entry["log"]).is_file()
        finals = [expected_seed(algo, s)[0] for s in (0, 1)]
        summary = result["summary"]["final_eval_return"]
        assert summary["mean"] == approx6(np.mean(finals))
        assert summary["std"] == approx6(np.std(finals, ddof=1))
        assert summary["iqm"] == approx6(np.mean(finals))  # 2 seeds: nothing trimmed
        assert summary["iqm_ci95"][0] <= summary["iqm"] <= summary["iqm_ci95"][1]
        assert result["config"]["num_envs"] == 4 and set(result["config_per_seed"]) == {"seed", "run_dir"}
        curve = result["curve"]
        assert len(curve["steps"]) == collect.CURVE_POINTS and curve["steps"][-1] == TOTAL
        assert curve["mean"][-1] == approx6(np.mean([expected_seed(algo, s)[1] for s in (0, 1)]))
        assert curve["mean"][0] is None  # no evaluation at step 0
        assert result["hardware"][0]["cores"] == os.cpu_count() and result["hardware"][0]["seeds"] == [0, 1]
        assert result["versions"][0]["python"] == ".".join(map(str, sys.version_info[:3]))
        assert result["sweep_commands"][0].startswith("python results/run.py --algos-dir")
    assert (out / "README.md").is_file() and (out / "env_x" / "curves.png").is_file()


def test_finished_runs_are_skipped_on_relaunch(local_sweep):
    out, _, log = local_sweep
    before = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*tfevents*")}
    proc = run_cli(out, "--algos", "fake_a,fake_b", "--seeds", "2", "--extra", "--num-envs 4", launch_log=log)
    assert proc.returncode == 0, proc.stderr
    assert "0 ran, 4 skipped, 0 failed" in proc.stdout
    assert len(launches(log)) == 4
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*tfevents*")} == before
    # The same directories asked to hold another command: refused, not silently reused.
    proc = run_cli(out, "--algos", "fake_a", "--seeds", "0,", "--extra", "--num-envs 8", launch_log=log)
    assert proc.returncode == 1 and "holds a finished run of another command" in proc.stderr
    assert len(launches(log)) == 4
    assert load(out, "fake_a")["seeds"] == [0, 1]  # nor collected over the sweep's result file


def test_schema_check_rejects_broken_documents(local_sweep):
    good = load(local_sweep[0], "fake_a")
    collect.check_result(good)
    breakages = {
        "missing key 'commit'": lambda r: r.pop("commit"),
        "per_seed[0].final_eval_return: expected int/float": lambda r: r["per_seed"][0].update(final_eval_return="x"),
        "curve.mean: 49 points": lambda r: r["curve"]["mean"].pop(),
        "seeds differ": lambda r: r["seeds"].reverse(),
        "total_timesteps: expected int, got bool": lambda r: r.update(total_timesteps=True),
        "unexpected key 'extra'": lambda r: r.update(extra=1),
        "iqm_ci95: expected [low, high]": lambda r: r["summary"]["final_eval_return"].update(iqm_ci95=[2.0, 1.0]),
    }
    for message, breakage in breakages.items():
        bad = copy.deepcopy(good)
        breakage(bad)
        with pytest.raises(ValueError, match=message.replace("[", r"\[")):
            collect.check_result(bad)


def test_collect_cli_rewrites_the_same_files(local_sweep, tmp_path):
    out = tmp_path / "results"
    shutil.copytree(local_sweep[0], out)
    before = {p.name: p.read_bytes() for p in (out / "env_x").glob("*.json")}
    for path in (out / "env_x").glob("*.json"):
        path.unlink()
    assert collect.main(["--out", str(out)]) == 0
    assert {p.name: p.read_bytes() for p in (out / "env_x").glob("*.json")} == before


def test_readme_and_png_regenerate_byte_identical(local_sweep, tmp_path):
    out = tmp_path / "results"
    (out / "env_x").mkdir(parents=True)
    for path in (local_sweep[0] / "env_x").glob("*.json"):
        shutil.copy(path, out / "env_x")
    (out / "speed").mkdir()
    (out / "speed" / "fake_speed.md").write_text("# Fake speed\n\n| op | ns |\n|---|---|\n| gae | 2.0 |\n")
    cmd = [sys.executable, str(RESULTS / "make_readme.py"), "--out", str(out)]
    outputs = []
    for _ in range(2):  # two processes: nothing may depend on the process (hash seeds, clocks)
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        outputs.append(((out / "README.md").read_bytes(), (out / "env_x" / "curves.png").read_bytes()))
    assert outputs[0] == outputs[1]
    readme, png = outputs[0]
    assert png.startswith(b"\x89PNG") and b"Software" not in png
    text = readme.decode()
    finals = [expected_final("fake_a", s) for s in (0, 1)]
    periodic = [expected_seed("fake_a", s)[0] for s in (0, 1)]
    assert (
        f"| `fake_a` | **{np.mean(finals):.2f} ± {np.std(finals, ddof=1):.2f}** (2 seeds, 2 ep. each) | "
        f"{np.mean(periodic):.2f} ± {np.std(periodic, ddof=1):.2f} (2 seeds) |" in text
    )
    assert "| `mappo-continuous` | — | not run yet |" in text and "-11.63 ± 1.50" in text
    assert "XuanCe benchmark table" in text
    assert "![env_x learning curves](env_x/curves.png)" in text
    assert "[speed/fake_speed.md](speed/fake_speed.md)" in text and "\n### Fake speed\n" in text
    # The figure does depend on the data: another curve gives another PNG.
    path = out / "env_x" / "fake_a.json"
    result = json.loads(path.read_text())
    result["curve"]["mean"] = [None if v is None else v + 5.0 for v in result["curve"]["mean"]]
    path.write_text(json.dumps(result))
    make_readme.generate(out)
    assert (out / "env_x" / "curves.png").read_bytes() != png


def published_row(tmp_path, env_id: str, algo: str):
    """A results root under tmp_path holding a copy of one published row: (root, the row as a dict, its path)."""
    out = tmp_path / "results"
    (out / env_id).mkdir(parents=True)
    result = json.loads((RESULTS / env_id / f"{algo}.json").read_text())
    path = out / env_id / f"{algo}.json"
    path.write_text(json.dumps(result))
    return out, result, path


def test_a_row_made_with_older_defaults_is_marked_stale(tmp_path):
    """Rerunning a row's recorded command with today's script must reproduce its config, or the README says so."""
    out = tmp_path / "results"
    (out / "simple_spread_v3").mkdir(parents=True)
    result = json.loads((RESULTS / "simple_spread_v3" / "mappo-continuous.json").read_text())
    path = out / "simple_spread_v3" / "mappo-continuous.json"
    result["config"] |= {"anneal_lr": False, "feature_norm": "running"}  # as if made with today's defaults
    path.write_text(json.dumps(result))
    text = make_readme.generate(out).read_text()
    assert "Stale" not in text and "(stale)" not in text
    result["config"]["gamma"] = 0.99  # as if the default had been 0.99 when the runs were made
    del result["config"]["rnn"]
    path.write_text(json.dumps(result))
    text = make_readme.generate(out).read_text()
    assert "| `mappo-continuous` (stale) |" in text
    assert "**Stale: `mappo-continuous`**" in text
    assert re.search(r"gamma 0\.99 → 0\.95; options added since: [a-z_, ]*\brnn\b", text)
    assert "to reproduce the row as it stands, give those options their values before the arrow" in text
    result["config"]["feature_norm"] = True  # the flag when it was a bool: True meant the paper's LayerNorm
    path.write_text(json.dumps(result))
    assert 'feature_norm "layer" → "running"' in make_readme.generate(out).read_text()  # today's spelling of it
    result["per_seed"][0]["command"] = result["per_seed"][0]["command"] + " --no-such-flag"
    path.write_text(json.dumps(result))
    assert "its command no longer parses (a flag was renamed or removed: Unrecognized options: --no-such-flag)" in (
        make_readme.generate(out).read_text()
    )  # the flag named, in tyro's words


def test_a_row_from_before_a_flag_is_stale_when_the_flags_new_default_differs_from_what_it_ran(tmp_path):
    """VDAC's rows from before --feature-norm ran without input normalization (Args.BEFORE_FLAGS: none); today's
    default is running, so rerunning their command would differ: stale. A row that recorded the flag is not."""
    out, result, path = published_row(tmp_path, "simple_spread_v3", "vdac-3m")
    assert "(stale)" not in make_readme.generate(out).read_text()
    del result["config"]["feature_norm"]  # as the rows made before the flag recorded it
    path.write_text(json.dumps(result))
    text = make_readme.generate(out).read_text()
    assert "| `vdac-3m` (stale) |" in text and 'feature_norm "none" → "running"' in text


def test_a_row_trained_on_other_env_kwargs_says_so_in_its_section_and_when_collected(local_sweep, tmp_path, capsys):
    """--env-kwargs change what a row's returns measure (simple_spread's local_ratio: another reward); the section
    marks such a row and names its kwargs, and collect.py says it on the way in. A standard row gets neither, nor
    does one whose kwargs spell out the env's own defaults."""
    out, result, path = published_row(tmp_path, "simple_spread_v3", "mappo-continuous")
    assert "(env kwargs)" not in make_readme.generate(out).read_text()
    result["config"]["env_kwargs"] = '{"N": 3, "local_ratio": 0.5}'  # simple_spread_v3's defaults
    path.write_text(json.dumps(result))
    assert "(env kwargs)" not in make_readme.generate(out).read_text()
    result["config"]["env_kwargs"] = '{"local_ratio": 0.0}'
    path.write_text(json.dumps(result))
    text = make_readme.generate(out).read_text()
    assert "| `mappo-continuous` (stale) (env kwargs) |" in text or "| `mappo-continuous` (env kwargs) |" in text
    assert "`mappo-continuous` trained and was evaluated with `--env-kwargs '{\"local_ratio\": 0.0}'`" in text
    sweep = tmp_path / "sweep"
    shutil.copytree(local_sweep[0], sweep)
    assert collect.main(["--out", str(sweep), "--algos", "fake_a"]) == 0
    assert "note:" not in capsys.readouterr().err
    for config in (sweep / "runs" / "env_x" / "fake_a").glob("seed*/config.json"):
        config.write_text(json.dumps({**json.loads(config.read_text()), "env_kwargs": '{"N": 4}'}))
    assert collect.main(["--out", str(sweep), "--algos", "fake_a"]) == 0
    err = capsys.readouterr().err
    assert "note: env_x/fake_a trained and was evaluated with --env-kwargs '{\"N\": 4}'" in err


def test_a_reference_stands_beside_the_variants_it_lists_and_only_those(tmp_path):
    out = tmp_path / "results"
    (out / "simple_spread_v3").mkdir(parents=True)
    for algo in ("maddpg", "maddpg-tf128", "maddpg-discrete"):
        shutil.copy(RESULTS / "simple_spread_v3" / f"{algo}.json", out / "simple_spread_v3")
    rows = {}  # the results table's row of each algorithm (the first: the run details repeat the names)
    for line in make_readme.generate(out).read_text().splitlines():
        if line.startswith("| `"):
            rows.setdefault(line.split(" |")[0], line)
    assert "-9.62 ± 0.28 (10M steps, best -6.35, continuous actions" in rows["| `maddpg`"]  # its own row: the note
    assert "| -9.62 ± 0.28 (10M steps, best -6.35) [1] |" in rows["| `maddpg-tf128`"]  # a listed variant: brief
    assert "-9.62" not in rows["| `maddpg-discrete`"]  # another action space: not listed
    assert "| `maddpg-tf64`" not in rows  # a listed variant that was not run gets no row


def test_competing_groups_get_a_per_group_table(tmp_path):
    out = tmp_path / "results"
    for env in ("simple_adversary_v3", "simple_speaker_listener_v4"):
        (out / env).mkdir(parents=True)
        shutil.copy(RESULTS / env / "mappo.json", out / env)
    result = json.loads((out / "simple_adversary_v3" / "mappo.json").read_text())
    finals = (-30.0, -32.0, -34.0, -32.0, -32.0)  # the final policies' per-group returns, not the periodic ones
    for p, final in zip(result["per_seed"], finals, strict=True):
        p["final_policy"]["per_group"] = {"adversary": final, "agent": 5.0}
        p["final_eval_return_by_group"] = {"adversary": 0.0, "agent": 0.0}
    (out / "simple_adversary_v3" / "mappo.json").write_text(json.dumps(result))
    text = make_readme.generate(out).read_text()
    adversary_section, listener_section = text.split("## simple_speaker_listener_v4")
    assert "| algorithm | `adversary` | `agent` |" in adversary_section
    assert "| `mappo` | -32.00 ± 1.41 | 5.00 ± 0.00 |" in adversary_section
    assert "Per group" not in listener_section  # a shared reward: the groups' returns are the same numbers
    overview = text.split("## MPE at a glance")[1].split("\n## ")[0]  # the team mean mixes opponents: per group too
    assert "| simple_adversary_v3 | `adversary` | -32.00 ± 1.41 |" in overview
    assert "simple_speaker_listener_v4 | `" not in overview
    result["config"]["random_groups"] = ["adversary"]
    (out / "simple_adversary_v3" / "mappo.json").write_text(json.dumps(result))
    assert "| `mappo` (frozen: adversary) | -32.00 ± 1.41 | 5.00 ± 0.00 |" in make_readme.generate(out).read_text()


def test_failed_run_is_reported_and_the_sweep_goes_on(tmp_path):
    log = tmp_path / "launches.txt"
    proc = run_cli(tmp_path, "--algos", "fake_fail,fake_a", "--seeds", "2", "--workers", "2", launch_log=log)
    assert proc.returncode == 1
    assert "2 ran, 0 skipped, 2 failed" in proc.stdout
    for seed in (0, 1):
        run_log = tmp_path.resolve() / "runs" / "env_x" / "fake_fail" / f"seed{seed}" / "run.log"
        # the line the script ended on, so that a sweep's typo needs no log opened to be seen
        said = "(error: fake_fail: boom, a deliberate failure at step 250)"
        assert f"FAILED env_x fake_fail seed {seed}: exit status 3 {said}; log: {run_log}" in proc.stderr
        assert "boom, a deliberate failure" in run_log.read_text()
        record = json.loads((run_log.parent / "run.json").read_text())
        assert record["status"] == "failed" and record["returncode"] == 3
    assert "env_x/fake_fail: no finished seed" in proc.stderr
    assert not (tmp_path / "env_x" / "fake_fail.json").exists()
    assert load(tmp_path, "fake_a")["seeds"] == [0, 1]
    # A relaunch retries the failed runs only.
    proc = run_cli(tmp_path, "--algos", "fake_fail,fake_a", "--seeds", "2", launch_log=log)
    assert proc.returncode == 1 and "0 ran, 2 skipped, 2 failed" in proc.stdout
    assert sorted(a for a, *_ in launches(log)) == ["fake_a"] * 2 + ["fake_fail"] * 4


def test_timeout_kills_a_hanging_run(tmp_path):
    log = tmp_path / "launches.txt"
    proc = run_cli(tmp_path, "--algos", "fake_hang", "--seeds", "0,", "--timeout", "2", launch_log=log)
    assert proc.returncode == 1 and "FAILED env_x fake_hang seed 0: timed out after 2.0 s" in proc.stderr
    (pid,) = [int(p) for *_, p in launches(log)]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_terminated_sweep_stops_its_runs(tmp_path):
    """The scripts run in their own sessions (for a clean timeout), so the sweep must stop them itself."""
    log = tmp_path / "launches.txt"
    cmd = [sys.executable, str(RESULTS / "run.py"), "--algos-dir", str(FAKES), "--out", str(tmp_path)]
    cmd += ["--envs", "env_x", "--total-timesteps", "10", "--algos", "fake_hang", "--seeds", "2"]
    proc = subprocess.Popen(cmd, env={**os.environ, "FAKE_LAUNCH_LOG": str(log)}, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(launches(log)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.terminate()
    assert proc.wait(timeout=60) == 130
    assert "interrupted" in proc.stderr.read().decode()
    for *_, pid in launches(log):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)


def test_a_row_is_collected_when_its_seeds_are_done_not_when_the_sweep_is(tmp_path):
    """A row's result file was written only when the whole sweep ended: a sweep of hours published nothing until
    then, and one stopped before its end left its finished rows to be collected by hand."""
    log = tmp_path / "launches.txt"
    cmd = [sys.executable, str(RESULTS / "run.py"), "--algos-dir", str(FAKES), "--out", str(tmp_path)]
    cmd += ["--envs", "env_x", "--total-timesteps", str(TOTAL), "--algos", "fake_a,fake_hang", "--seeds", "2"]
    cmd += ["--workers", "1"]
    proc = subprocess.Popen(cmd, env={**os.environ, "FAKE_LAUNCH_LOG": str(log)}, stdout=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (tmp_path / "env_x" / "fake_a.json").exists(), "fake_a's result file")
        assert proc.poll() is None  # the sweep goes on: fake_hang never ends
        _wait_for(lambda: any(algo == "fake_hang" for algo, *_ in launches(log)), "the sweep to reach fake_hang")
        assert load(tmp_path, "fake_a")["seeds"] == [0, 1]
    finally:  # the sweep stops its scripts when terminated, and leaves none behind if an assertion failed
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert f"wrote {tmp_path.resolve() / 'env_x' / 'fake_a.json'}" in out
    assert not (tmp_path / "env_x" / "fake_hang.json").exists() and not (tmp_path / "README.md").exists()


def test_status_says_where_each_run_of_a_sweep_stands_and_touches_nothing(tmp_path):
    assert run_cli(tmp_path, "--algos", "fake_a", "--seeds", "2", "--no-readme").returncode == 0
    assert run_cli(tmp_path, "--algos", "fake_fail", "--seeds", "0,", "--no-readme").returncode == 1
    log = tmp_path / "launches.txt"
    cmd = [sys.executable, str(RESULTS / "run.py"), "--algos-dir", str(FAKES), "--out", str(tmp_path)]
    cmd += ["--envs", "env_x", "--total-timesteps", str(TOTAL), "--algos", "fake_hang", "--seeds", "0,"]
    hang = subprocess.Popen(cmd, env={**os.environ, "FAKE_LAUNCH_LOG": str(log)}, stdout=subprocess.DEVNULL)
    sweep = ("--algos", "fake_a,fake_fail,fake_hang", "--seeds", "3", "--status")
    try:
        _wait_for(lambda: launches(log), "fake_hang to start")
        lines = run_cli(tmp_path, *sweep).stdout.splitlines()
    finally:
        hang.terminate()
        hang.wait(timeout=60)
    assert lines[0].startswith("done     env_x fake_a seed 0 (") and lines[2] == "pending  env_x fake_a seed 2"
    run_log = tmp_path.resolve() / "runs" / "env_x" / "fake_fail" / "seed0" / "run.log"
    assert lines[3].startswith("failed   env_x fake_fail seed 0: exit status 3 (error: fake_fail: boom, a deliberate")
    assert lines[3].endswith(f"); log: {run_log}")
    assert lines[6] == f"running  env_x fake_hang seed 0 (sweep pid {hang.pid})"
    assert lines[-1] == "2 done, 5 pending, 1 failed, 1 running (of 9 runs)"
    assert not (tmp_path / "runs" / "env_x" / "fake_a" / "seed2").exists()  # nothing claimed or made
    lines = run_cli(tmp_path, *sweep).stdout.splitlines()  # the sweep stopped mid-run: a relaunch continues it
    assert lines[6] == "stopped  env_x fake_hang seed 0: launching the sweep again continues it from its last.pt"
    run_dir = tmp_path / "runs" / "env_x" / "fake_hang" / "seed0"
    with open(run_dir / "run.log", "a") as log_file:  # a script's progress bar, as tqdm writes it
        log_file.write(" 50%|#####     | 500/1000 [04:04<03:58, 2.05step/s, SPS=2]\r")
    lines = run_cli(tmp_path, *sweep).stdout.splitlines()
    assert lines[6].startswith("stopped  env_x fake_hang seed 0 at step 500 of 1,000 (50%): ")
    assert sweep_runner.time_left(run_dir) == "03:58"
    # a reader that has gone before the first line (`--status | head` with a long sweep): no BrokenPipeError trace
    read_end, write_end = os.pipe()
    os.close(read_end)
    cmd = [sys.executable, str(RESULTS / "run.py"), "--algos-dir", str(FAKES), "--out", str(tmp_path)]
    cmd += ["--envs", "env_x", "--total-timesteps", str(TOTAL), *sweep]
    gone = subprocess.run(cmd, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    os.close(write_end)
    assert gone.returncode == 0 and gone.stderr == ""


def _sweep_command(out: Path, *flags: str) -> list[str]:
    cmd = [sys.executable, str(RESULTS / "run.py"), "--algos-dir", str(FAKES), "--out", str(out)]
    return cmd + ["--envs", "env_x", "--total-timesteps", str(TOTAL), "--algos", "fake_a", "--workers", "1", *flags]


def _wait_for(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_two_sweeps_over_the_same_runs_share_them_and_lose_nothing(tmp_path):
    """A second sweep started while the first runs passes over the run in progress, runs the free one meanwhile, and
    never empties the held directory.

    The bugs: the second sweep emptied every pending directory at launch, its script then refused the directory the
    first was using, and its "failed" record replaced the first's finished one; collect dropped that seed. Later it
    waited on the held run in queue order, idle while a free run stood behind it.
    """
    log = tmp_path / "launches.txt"
    env = {**os.environ, "FAKE_LAUNCH_LOG": str(log), "FAKE_EVAL_SLEEP": "0.2"}
    cmd = _sweep_command(tmp_path, "--seeds", "2")
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: launches(log), "the first sweep's first run")
    second = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: len(launches(log)) == 2, "the second sweep's run")
    seed0 = tmp_path / "runs" / "env_x" / "fake_a" / "seed0"
    assert json.loads((seed0 / "run.json").read_text())["status"] == "launched"  # seed 1 began while seed 0 ran
    second_out, second_err = second.communicate(timeout=180)
    first_out, first_err = first.communicate(timeout=180)
    assert first.returncode == 0, first_out + first_err
    assert second.returncode == 0, second_out + second_err
    assert sorted(int(seed) for *_, seed, _ in launches(log)) == [0, 1]  # each run executed once
    held = "busy    env_x fake_a seed 0: in use by another sweep (pid {}); running the free runs first, then waiting"
    assert held.format(first.pid) in second_out
    for seed in (0, 1):
        record = json.loads((tmp_path / "runs" / "env_x" / "fake_a" / f"seed{seed}" / "run.json").read_text())
        assert record["status"] == "ok"
    assert load(tmp_path, "fake_a")["seeds"] == [0, 1]


def test_a_sweep_that_adds_seeds_keeps_the_earlier_seeds_in_the_result_file(tmp_path):
    """A sweep of seed 2 after one of seeds 0 and 1 (same label and budget) wrote a result file of seed 2 alone: the
    published seeds 0 and 1 were dropped from it without a word. A seed trained for another budget stays out, named."""
    first = run_cli(tmp_path, "--algos", "fake_a", "--seeds", "2", "--workers", "1", "--no-readme")
    assert first.returncode == 0, first.stdout + first.stderr
    assert load(tmp_path, "fake_a")["seeds"] == [0, 1]
    other = run_cli(tmp_path, "--algos", "fake_a", "--seeds", "3,", "--workers", "1", "--no-readme", "--no-collect")
    assert other.returncode == 0, other.stdout + other.stderr
    record = tmp_path / "runs" / "env_x" / "fake_a" / "seed3" / "run.json"
    record.write_text(json.dumps(json.loads(record.read_text()) | {"total_timesteps": TOTAL * 2}))
    more = run_cli(tmp_path, "--algos", "fake_a", "--seeds", "2,", "--workers", "1", "--no-readme")
    assert more.returncode == 0, more.stdout + more.stderr
    assert load(tmp_path, "fake_a")["seeds"] == [0, 1, 2]
    earlier = "env_x/fake_a: also collecting seed(s) [0, 1], finished by an earlier sweep of the same budget"
    assert earlier in more.stdout
    assert f"env_x/fake_a: leaving out seed(s) [3], not trained by a sweep of {TOTAL:,} steps" in more.stdout


def test_a_sweep_waits_for_a_script_running_in_its_directory_and_never_empties_one_it_did_not_start(tmp_path):
    run_dir = tmp_path / "runs" / "env_x" / "fake_a" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"status": "failed", "error": "exit status 137"}))
    (run_dir / "last.pt").write_text("{}")  # resumed by hand after the sweep's run was killed
    held = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    os.write(held, b"4242")
    log, stdout = tmp_path / "launches.txt", tmp_path / "sweep.out"
    with open(stdout, "w") as out:
        proc = subprocess.Popen(
            _sweep_command(tmp_path, "--seeds", "0,"),
            env={**os.environ, "FAKE_LAUNCH_LOG": str(log)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    busy = "busy    env_x fake_a seed 0: in use by a running script (pid 4242); running the free runs first"
    _wait_for(lambda: busy in stdout.read_text(), "the sweep to wait for the script")
    assert (run_dir / "last.pt").exists() and json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    os.close(held)  # the script ends, its run unfinished: the sweep runs it again
    assert proc.wait(timeout=60) == 0, stdout.read_text()
    assert len(launches(log)) == 1 and json.loads((run_dir / "run.json").read_text())["status"] == "ok"
    # Files with no sweep record at all are someone's own run: refused, not emptied.
    other = tmp_path / "runs" / "env_x" / "fake_a" / "seed1"
    other.mkdir()
    (other / "last.pt").write_text("{}")
    proc = run_cli(tmp_path, "--algos", "fake_a", "--seeds", "1,", launch_log=log)
    assert proc.returncode == 1 and "holds files of a run no sweep started (no run.json)" in proc.stderr
    assert (other / "last.pt").exists() and len(launches(log)) == 1


def test_an_interrupted_sweep_continues_its_run_from_the_checkpoint_when_launched_again(tmp_path):
    """The sweep is stopped mid-run (SIGTERM); launched again it resumes that run instead of restarting it, and the
    run's evaluations come out as if it had never stopped (the fake's curve is a function of the step)."""
    log = tmp_path / "launches.txt"
    cmd = _sweep_command(tmp_path, "--seeds", "0,")
    run_dir = tmp_path / "runs" / "env_x" / "fake_a" / "seed0"
    first = subprocess.Popen(cmd, env={**os.environ, "FAKE_LAUNCH_LOG": str(log), "FAKE_EVAL_SLEEP": "0.2"})
    evals = lambda: json.loads((run_dir / "last.pt").read_text())["evals"] if (run_dir / "last.pt").exists() else 0  # noqa: E731
    _wait_for(lambda: evals() >= 5, "five evaluations")
    first.terminate()
    assert first.wait(timeout=60) == 130
    stopped_at = evals()
    assert 5 <= stopped_at < _fake.NUM_EVALS
    proc = run_cli(tmp_path, "--algos", "fake_a", "--seeds", "0,", "--workers", "1", launch_log=log)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resume  env_x fake_a seed 0" in proc.stdout and "1 ran, 0 skipped, 0 failed" in proc.stdout
    (_, second) = launches(log)
    assert second[-1] == "resume"  # one launch resumed, none restarted
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "ok" and len(record["resumes"]) == 1 and record["resumes"][0]["status"] == "launched"
    assert "--resume" in record["resume_command"] and "--run-dir" not in record["resume_command"]
    assert record["command"] == sweep_runner.plan(sweep_runner.parse_args([*cmd[2:]]))[0].command
    assert record["wall_time_s"] > 5 * 0.2  # both launches
    final, best = expected_seed("fake_a", 0)
    seed = load(tmp_path, "fake_a")["per_seed"][0]
    assert seed["final_eval_return"] == approx6(final) and seed["best_eval_return"] == approx6(best)
    assert seed["num_evals"] == _fake.NUM_EVALS  # nothing evaluated twice or skipped
    # Launched again: finished, so skipped.
    proc = run_cli(tmp_path, "--algos", "fake_a", "--seeds", "0,", "--workers", "1", launch_log=log)
    assert proc.returncode == 0 and "0 ran, 1 skipped" in proc.stdout and len(launches(log)) == 2


def _real_sweep(out: Path, seed: int, extra: str) -> list[str]:
    """results/run.py on algos/mfq.py (an off-policy script: weights, optimizer, RNG and a replay buffer to keep)."""
    cmd = [sys.executable, str(RESULTS / "run.py"), "--out", str(out), "--algos", "mfq", "--envs", "simple_spread_v3"]
    return cmd + ["--seeds", f"{seed},", "--total-timesteps", "3000", "--workers", "1", "--no-readme", "--extra", extra]


REAL_FLAGS = "--num-envs 4 --learning-starts 400 --buffer-size 6000 --final-eval-episodes 20 --eval-episodes 2"


@pytest.fixture
def sweeps(tmp_path):
    """Starts sweeps, each in a session of its own, and kills what is left of them when the test ends, their scripts
    too (run.py starts each in a session of its own; its run dir's .lock names it): a look that fails while a script
    stands still between SIGSTOPs leaves no stopped script behind it."""
    started = []

    def start(cmd: list[str]) -> subprocess.Popen:
        started.append(
            subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        )
        return started[-1]

    yield start
    for sweep in started:
        _reap(sweep)
    for lock in tmp_path.rglob(".lock"):
        pid = _script_pid(lock.parent)
        try:  # the pid still this run's script's, not reused
            if str(lock.parent) in Path(f"/proc/{pid}/cmdline").read_text():
                os.killpg(pid, signal.SIGKILL)
        except OSError:  # ended (or never started)
            pass


def _reap(sweep: subprocess.Popen) -> None:
    """Kill what is left of the sweep's session (SIGKILL ends a stopped process too)."""
    try:
        os.killpg(sweep.pid, signal.SIGKILL)
    except ProcessLookupError:  # nothing left of it
        pass
    sweep.wait(timeout=30)


def test_a_real_sweep_stopped_by_sigterm_resumes_where_it_stopped_and_learns_as_if_never_stopped(tmp_path, sweeps):
    """Stopped by SIGTERM and launched again, the run goes on from its last.pt with its replay buffer, RNG, env state
    and loop state: every loss logged after the resume, and the final weights, equal those of a run never stopped."""
    import torch

    run_dir = tmp_path / "runs" / "simple_spread_v3" / "mfq" / "seed0"
    flags = REAL_FLAGS + " --eval-interval 1000 --log-interval 40"  # last.pt at each evaluation: a step to stop at
    cmd = _real_sweep(tmp_path, 0, flags)
    never_stopped = sweeps(_real_sweep(tmp_path / "ref", 0, flags))
    first = sweeps(cmd)
    _wait_for(lambda: _script_pid(run_dir) or first.poll() is not None, "the script to start", timeout=180)
    pid = _script_pid(run_dir)
    assert _held_when(pid, first, lambda: (sweep_runner.checkpoint_step(run_dir) or 0) >= 1000), "it ended first"
    first.terminate()  # the sweep passes SIGTERM on to the script, which stands still until it has it
    _wait_for(lambda: _pending(pid, signal.SIGTERM), "the sweep to pass SIGTERM on")
    os.kill(pid, signal.SIGCONT)
    assert first.wait(timeout=120) == 130
    step = sweep_runner.checkpoint_step(run_dir)
    assert 1000 <= step < 2000 and (run_dir / "replay.npz").exists()
    ckpt = torch.load(run_dir / "last.pt", weights_only=True)
    assert ckpt["replay_step"] == step  # the buffer beside it is this stop's
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"resume  simple_spread_v3 mfq seed 0 from step {step:,} of its last.pt, where it stopped" in proc.stdout
    log = (run_dir / "run.log").read_text()
    assert re.search(r"resumed with the [1-9]\d* transitions", log) and "done: 3000 steps" in log
    resumes = [json.loads(line) for line in (run_dir / "resumes.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in resumes] == [step] and resumes[0]["changed"] == {}
    assert json.loads((run_dir / "run.json").read_text())["status"] == "ok"
    assert json.loads((run_dir / "final_eval.json").read_text())["global_step"] == 3000
    assert json.loads((tmp_path / "simple_spread_v3" / "mfq.json").read_text())["seeds"] == [0]
    # the run that never stopped
    assert never_stopped.wait(timeout=300) == 0
    ref_dir = tmp_path / "ref" / "runs" / "simple_spread_v3" / "mfq" / "seed0"
    resumed, ref = collect.read_scalars(run_dir), collect.read_scalars(ref_dir)
    for tag in ("losses/td_loss", "losses/q_values"):
        after = ref[tag][0] > step
        assert after.sum() >= 10 and (ref[tag][0][after] == resumed[tag][0][resumed[tag][0] > step]).all()
        np.testing.assert_array_equal(resumed[tag][1][resumed[tag][0] > step], ref[tag][1][after], err_msg=tag)
    end, ref_end = (torch.load(d / "last.pt", weights_only=True)["nets"]["mfq"] for d in (run_dir, ref_dir))
    assert all(torch.equal(end[k], ref_end[k]) for k in ref_end)
    finals = [json.loads((d / "final_eval.json").read_text())["returns"] for d in (run_dir, ref_dir)]
    assert finals[0] == finals[1]


def _script_pid(run_dir: Path) -> int | None:
    """The pid of the script running in ``run_dir`` (its ``.lock`` names it), None before it starts."""
    try:
        text = (run_dir / ".lock").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _pending(pid: int, sig: int) -> bool:
    """Whether ``sig`` waits to be delivered to the (stopped) process ``pid``: its /proc status's pending masks."""
    status = Path(f"/proc/{pid}/status").read_text()
    masks = re.findall(r"^(?:SigPnd|ShdPnd):\s*([0-9a-f]+)$", status, flags=re.M)
    return any(int(mask, 16) >> (sig - 1) & 1 for mask in masks)


def _stopped(pid: int) -> bool:
    """Whether every thread of the process ``pid`` has stopped (a zombie counts; ProcessLookupError once it is gone,
    which ``_held_when`` takes as the script's end). kill(SIGSTOP) returns with the signal only queued: the process
    stops when one of its threads next runs, and on a loaded machine a SIGTERM sent in between is taken first (its
    handler runs, the lower signal number dequeued first), so it is never seen pending while the script stands still
    (without this look the SIGTERM test failed 2 of 12 runs beside five training runs)."""
    try:
        states = [
            (task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in Path(f"/proc/{pid}/task").iterdir()
        ]
    except OSError:  # it ended between two looks
        raise ProcessLookupError(pid) from None
    return all(state in "tTZX" for state in states)


def _held_when(pid: int | None, sweep: subprocess.Popen, predicate) -> bool:
    """Let the script ``pid`` run in 20 ms slices between SIGSTOPs until ``predicate()`` holds while it stands still:
    True with the script left stopped, False when the sweep or the script ended first. However fast or loaded the
    machine, what is done next lands at the state the predicate saw (racing the script instead missed on the
    project's CI machine: five kill -9 tries in a row; a SIGTERM meant for step 1200 landed past 2,900)."""
    try:
        while pid and sweep.poll() is None:
            os.kill(pid, signal.SIGSTOP)
            _wait_for(lambda: _stopped(pid), "the script to stop")
            if predicate():
                return True
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.02)
    except ProcessLookupError:  # the script ended between two looks
        pass
    return False


def _kill_9_at_a_gap(root: Path, sweeps) -> tuple[list, Path, int, int] | None:
    """A real sweep killed with kill -9 once its log is past its last.pt: (cmd, run dir, last.pt's step,
    logged step), or None when the run ended first. The gap is looked for while the script stands still
    (``_held_when``), so that the kill lands inside a gap."""
    run_dir = root / "runs" / "simple_spread_v3" / "mfq" / "seed1"
    cmd = _real_sweep(root, 1, REAL_FLAGS + " --eval-interval 1000")  # last.pt each eval
    first = sweeps(cmd)

    def saved() -> int:
        return sweep_runner.checkpoint_step(run_dir) or 0

    def gap() -> bool:
        return saved() >= 1000 and (sweep_runner.reached_step(run_dir) or 0) > saved()

    try:
        _wait_for(lambda: _script_pid(run_dir) or first.poll() is not None, "the script to start", 300)
        pid = _script_pid(run_dir)  # held from its start: free, it ran from its first last.pt to its end unseen
        if not _held_when(pid, first, gap):
            return None
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # the script ended between two looks
        return None
    finally:  # the sweep records nothing more: what the kill left is what the resume finds
        _reap(first)
    step, reached = saved(), sweep_runner.reached_step(run_dir)
    assert reached > step, (step, reached)
    return cmd, run_dir, step, reached


def test_a_real_sweep_killed_with_kill_9_resumes_from_the_last_periodic_checkpoint_and_says_what_was_lost(
    tmp_path, sweeps
):
    for attempt in range(3):
        killed = _kill_9_at_a_gap(tmp_path / f"try{attempt}", sweeps)
        if killed is not None:
            break
    else:
        pytest.fail("three tries in a row ended before the kill")
    cmd, run_dir, step, reached = killed
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lost = f"from step {step:,} of its last.pt: it had reached at least step {reached:,}, so {reached - step:,} or more"
    assert lost in proc.stdout
    log = (run_dir / "run.log").read_text()
    assert "replay.npz does not exist: the replay buffer refills from scratch" in log and "done: 3000 steps" in log
    assert f"the envs start new episodes at step {step} (the replay buffer refills)" in log
    assert json.loads((run_dir / "run.json").read_text())["resumes"][0]["status"] == "launched"


def test_a_record_is_never_written_over_another_launch(tmp_path):
    argv = ["--algos", "fake_a", "--envs", "env_x", "--seeds", "0,", "--total-timesteps", "7"]
    (run,) = sweep_runner.plan(sweep_runner.parse_args([*argv, "--algos-dir", str(FAKES), "--out", str(tmp_path)]))
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "run.json").write_text(json.dumps({"status": "ok", "launch_id": "theirs"}))
    clash = sweep_runner.finish(run, {"status": "failed", "launch_id": "ours"}, None)
    assert "now holds another launch (theirs)" in clash
    assert json.loads((run.run_dir / "run.json").read_text())["status"] == "ok"


def test_collect_names_the_seeds_it_leaves_out(local_sweep, tmp_path, capsys):
    out = tmp_path / "results"
    shutil.copytree(local_sweep[0], out)
    record = out / "runs" / "env_x" / "fake_a" / "seed1" / "run.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "status": "failed", "error": "exit status 2"}))
    assert collect.main(["--out", str(out), "--algos", "fake_a"]) == 0
    assert "env_x/fake_a seed 1 left out, not finished (exit status 2)" in capsys.readouterr().err
    assert load(out, "fake_a")["seeds"] == [0]


# ---------------------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------------------


def test_ray_sweep_matches_the_local_one(local_sweep, tmp_path):
    pytest.importorskip("ray")
    proc = run_cli(
        tmp_path,
        "--algos",
        "fake_a,fake_b",
        "--seeds",
        "2",
        "--ray",
        "--workers",
        "2",
        "--extra",
        "--num-envs 4",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 ran, 0 skipped, 0 failed" in proc.stdout
    for algo in FAKE_CURVES:
        ours, local = load(tmp_path, algo), load(local_sweep[0], algo)
        assert collect.result_errors(ours) == []
        assert ours["summary"]["final_eval_return"] == local["summary"]["final_eval_return"]
        assert ours["curve"]["mean"] == local["curve"]["mean"]
        record = json.loads((tmp_path / "runs" / "env_x" / algo / "seed0" / "run.json").read_text())
        assert record["status"] == "ok" and "node" in record and "--ray" in record["sweep_command"]


def test_protocol_v2_final_evaluations_are_collected_and_are_the_readme_headline(local_sweep, tmp_path):
    src, _, _ = local_sweep
    out = tmp_path / "results"
    shutil.copytree(src, out)
    a = load(out, "fake_a")
    collect.check_result(a)
    finals = [expected_final("fake_a", seed) for seed in (0, 1)]  # each run's final_eval.json (runtime.Run.finish)
    assert a["evaluation_protocol"] == "v2" and [p["final_policy"]["mean"] for p in a["per_seed"]] == finals
    assert a["summary"]["final_policy"]["mean"] == pytest.approx(np.mean(finals))
    text = make_readme.generate(out).read_text()
    std = np.std(finals, ddof=1)
    assert f"| `fake_a` | **{np.mean(finals):.2f} ± {std:.2f}** (2 seeds, 2 ep. each) |" in text
    header = next(line for line in text.splitlines() if line.startswith("| algorithm | "))
    assert header.split(" | ")[1].startswith("**final policy**")  # the headline: the first numeric column
    # a seed without final_eval.json (a run made before protocol v2): collected as v1, which is never published
    (out / "runs" / "env_x" / "fake_b" / "seed1" / "final_eval.json").unlink()
    assert collect.main(["--out", str(out)]) == 0
    b = load(out, "fake_b")
    assert b["evaluation_protocol"] == "v1" and "final_policy" not in b["summary"]
    with pytest.raises(SystemExit, match=r"fake_b\.json: made under evaluation protocol v1, not v2 .* rerun it"):
        make_readme.generate(out)


def test_every_published_row_is_protocol_v2_and_the_readme_is_made_from_them(tmp_path):
    paths = collect.result_paths(RESULTS)
    assert len(paths) > 100  # the results root, not an empty folder
    v1 = [str(p.relative_to(RESULTS)) for p in paths if json.loads(p.read_text()).get("evaluation_protocol") != "v2"]
    assert v1 == [], f"rerun these under protocol v2 (their recorded sweep commands): {v1}"
    make_readme.load_results(RESULTS)  # refuses a v1 row with the line that says so


def test_the_readme_says_what_a_comm_scripts_messages_are_worth_with_an_interval():
    def row(means):
        return {"evaluation_protocol": "v2", "per_seed": [{"final_policy": {"mean": m}} for m in means]}

    ours = {
        "commnet-3m": row([-10.0, -11.0, -12.0]),
        "commnet-3m-nocomm": row([-20.0, -21.0, -22.0]),
        "ic3net-3m": row([-10.0, -11.0]),  # no row without messages beside it
        "tarmac-3m-nocomm": row([-20.0]),  # no row with messages beside it
    }
    lines = make_readme.message_worth_table("simple_reference_v3", ours)
    rows = [line for line in lines if line.startswith("| `")]
    assert len(rows) == 1 and rows[0].startswith("| `commnet-3m` vs `commnet-3m-nocomm` | -11.00 ± 1.00 (3 seeds) |")
    low, high = (float(x) for x in rows[0].split("[")[1].rstrip("] |").split(", "))
    assert 8.0 <= low < 10.0 < high <= 12.0  # within what resampled seeds can give: -12 - (-20) .. -10 - (-22)
    assert "| -21.00 ± 1.00 (3 seeds) | +10.00 [" in rows[0]
    assert collect.difference_ci([1.0, 1.0], [3.0]) == (-2.0, -2.0)  # no spread: the interval is the difference
    assert make_readme.message_worth_table("simple_reference_v3", {"commnet-3m": row([-10.0])}) == []
    # on a benchmark task, the team's totals (2 players: twice the mean over agents), as the benchmark's table
    team = make_readme.message_worth_table("Foraging-2s-8x8-2p-2f-coop", ours)
    assert "the sum over its 2 agents" in team[0]
    assert [r for r in team if r.startswith("| `")][0].startswith(
        "| `commnet-3m` vs `commnet-3m-nocomm` | -22.00 ± 2.00"
    )
    with pytest.raises(ValueError, match="at least one value on each side"):
        collect.difference_ci([], [1.0])


def test_an_epymarl_benchmark_task_gets_the_benchmarks_team_totals_and_its_maximum_and_average_returns():
    def row(evaluations, finals, steps=(50, 100, 150)):
        pairs = zip(evaluations, finals, strict=True)
        per_seed = [
            {"final_policy": {"mean": f}, "evaluations": {"steps": list(steps), "returns": r}} for r, f in pairs
        ]
        return {"per_seed": per_seed, "config": {"eval_interval": 50}}

    # two seeds, three evaluations each: the mean over seeds peaks at the second (0.35), the mean of all is 0.25
    qmix = row([[0.1, 0.3, 0.2], [0.2, 0.4, 0.3]], [0.25, 0.35])
    assert make_readme.team_size("Foraging-2s-10x10-3p-3f") == 3 and make_readme.team_size("rware-tiny-4ag") == 4
    assert (
        make_readme.team_size("simple_spread_v3") is None
        and make_readme.benchmark_table("simple_v3", {"q": qmix}) == []
    )
    lines = make_readme.benchmark_table("Foraging-8x8-2p-2f-coop", {"qmix": qmix})
    assert "the sum over its 2 agents" in lines[0]
    rows = [line for line in lines if line.startswith("| `")]
    # the team total: 2 agents x the mean over agents
    assert rows == ["| `qmix` | **0.60 ± 0.14** (2 seeds) | 0.70 | 0.50 | 3 (every 50) |"]
    # seeds that evaluated at other steps have no mean over seeds at an evaluation: no figure, said so
    shifted = row([[0.1, 0.3, 0.2], [0.2, 0.4]], [0.25, 0.35])
    shifted["per_seed"][1]["evaluations"]["steps"] = [50, 100]
    assert make_readme.epymarl_metrics(shifted) is None
    assert "at different steps" in make_readme.benchmark_table("rware-tiny-2ag", {"vdn": shifted})[-2]
    # EPyMARL's tests drift by an episode, and a resumed seed tests once more where it resumed: on the grid, the last
    # one nearest each multiple of the interval counts
    drift = row([[0.1, 0.3, 0.2], [0.2, 0.9, 0.4, 0.3]], [0.25, 0.35])
    drift["per_seed"][0]["evaluations"]["steps"] = [50, 96, 152]
    drift["per_seed"][1]["evaluations"]["steps"] = [50, 100, 104, 154]  # 104: the resumed seed's extra test
    assert make_readme.epymarl_metrics(drift) == pytest.approx((0.35, 0.25, 3))
    drift["per_seed"][1]["evaluations"]["steps"] = [50, 100, 104, 204]  # a test missing at 150: no common grid
    assert make_readme.epymarl_metrics(drift) is None
    del qmix["per_seed"][0]["evaluations"]  # collected before the evaluations were kept
    assert make_readme.epymarl_metrics(qmix) is None


def test_the_benchmark_at_a_glance_has_a_cell_per_task_and_algorithm_in_team_totals(monkeypatch, tmp_path):
    def row(algo, env_id, finals, steps, best=0.5):
        per_seed = [{"final_policy": {"mean": f}, "evaluations": {"steps": [10], "returns": [best]}} for f in finals]
        return {"algo": algo, "env_id": env_id, "per_seed": per_seed, "total_timesteps": steps}

    lbf, twin = "Foraging-8x8-2p-2f-coop", "Foraging-10x10-3p-3f"
    by_env = {
        lbf: [row("mappo", lbf, [0.5, 0.5, 0.49], 20_000_000), row("iql", lbf, [0.1, 0.2, 0.3], 1_000_000),
              row("qmix-tf50", lbf, [0.6] * 3, 2_000_000), row("coma", lbf, [0.0, 0.0], 20_000_000, best=0.45)],
        twin: [row("vdn", twin, [0.1] * 3, 2_000_000)],
        "simple_spread_v3": [row("mappo", "simple_spread_v3", [-10.0] * 3, 20_000_000)],
    }  # fmt: skip
    lines = make_readme.benchmark_overview(by_env)
    assert lines[0] == "## The EPyMARL benchmark at a glance"
    header, rows = lines[4], [line for line in lines if line.startswith("| Foraging")]
    assert header.split(" | ")[1:4] == ["`iql`", "`vdn`", "`qmix`"] and "qmix-tf50" not in header  # variants: below
    assert [r.split(" | ")[0] for r in rows] == [f"| {lbf}", f"| {twin}"]  # the benchmark's order; MPE is not in it
    cells = dict(zip(header.strip("| ").split(" | "), rows[0].strip("| ").split(" | "), strict=True))
    assert cells["`mappo`"] == "**0.99 ± 0.01** [1.00]"  # 2 players: the team's total; the task's best in bold
    assert cells["`iql`"] == "0.40 ± 0.20 [1.00] (1M)"  # not the benchmark's 2M: said so
    assert cells["`coma`"] == "0.00 ± 0.00 [0.90] (2 seeds)" and cells["`vdn`"] == "—"
    assert make_readme.benchmark_overview({"simple_v3": by_env["simple_spread_v3"]}) == []
    # its heatmap: the same cells, coloured as a fraction of the task's best, another budget or seed count hatched
    drawn = {}
    monkeypatch.setattr(make_readme, "draw_heatmap", lambda *args: drawn.update(zip("prasth", args[:6], strict=True)))
    assert make_readme.plot_benchmark(by_env, tmp_path / "x.png") and drawn["r"] == [lbf, twin]
    algos, shade = drawn["a"], drawn["s"]
    assert algos == list(make_readme.BENCHMARK_ROWS) and shade.shape == (2, 7)
    mappo, iql, coma, vdn = (algos.index(a) for a in ("mappo", "iql", "coma", "vdn"))
    assert shade[0, mappo] == 1 and shade[0, iql] == pytest.approx(0.4 / (2 * 1.49 / 3)) and shade[0, coma] == 0
    assert np.isnan(shade[0, vdn]) and shade[1, vdn] == 1  # not run: no colour; the task's only cell: its best
    assert drawn["h"][0, iql] and drawn["h"][0, coma] and not drawn["h"][0, mappo]
    texts = drawn["t"][0]
    assert texts[iql] == "0.40\n1M" and texts[coma] == "0.00\n2 seeds" and texts[mappo] == "0.99"
    assert make_readme.plot_benchmark({"simple_v3": by_env["simple_spread_v3"]}, tmp_path / "x.png") is False
    assert make_readme.budget_note(row("mappo", lbf, [0.5], 10_000_000), 20_000_000) == "10M, 1 seed"


def test_every_curve_of_a_panel_has_its_own_colour_and_line_style():
    algos = "maddpg maddpg-tf64 maddpg-tf128 maddpg-bs1024 maddpg-discrete matd3 iddpg iddpg-tf64 mappo ippo qmix mfq"
    results = [{"algo": a} for a in [*algos.split(), "mappo-continuous"]]
    panels = make_readme.curve_styles(results)
    # every figure in the same order; an algorithm of no known family gets a panel of its own, last
    assert list(panels) == ["on-policy (PPO)", "DDPG family", "value-based", "mfq"]
    for rows in panels.values():
        styles = [(color, style) for _, color, style in rows]
        assert len(set(styles)) == len(styles)
        assert len({color for color, _ in styles}) == len(styles)  # up to nine rows, a colour each
        for result, _, style in rows:  # the base solid, its variants not
            assert (style == "-") == ("-" not in result["algo"]), result["algo"]
    assert sum(len(rows) for rows in panels.values()) == len(results)
    many = make_readme.curve_styles([{"algo": f"maddpg-v{i}"} for i in range(30)])["DDPG family"]
    assert len({(color, style) for _, color, style in many}) == 30  # colours come back, never with the same style


def test_published_figures_are_drawn_in_the_colour_of_their_algorithm(tmp_path):
    results = [{"algo": a, "env_id": "e"} for a in ("maddpg", "maddpg-tf64", "iddpg-tf64", "mappo-continuous")]
    panels = make_readme.curve_styles(results)
    colour = {r["algo"]: c for rows in panels.values() for r, c, _ in rows}
    ref = dict(env_id="e", mean=-10.0, total_timesteps=10)
    references = [
        ref | {"algo": "maddpg", "variants": ["maddpg-tf64"]},  # its own row's colour, not its variant's
        ref | {"algo": "iddpg", "variants": ["iddpg-tf64"]},  # not run itself: the colour of its listed variant
        ref | {"algo": "matd3"},  # neither it nor a variant plotted: not drawn
        ref | {"algo": "mappo-continuous"},
    ]
    drawn = make_readme.panel_references(panels, references)
    as_pairs = {family: [(r["algo"], c) for r, c in refs] for family, refs in drawn.items()}
    assert as_pairs == {
        "DDPG family": [("iddpg", colour["iddpg-tf64"]), ("maddpg", colour["maddpg"])],
        "on-policy (PPO)": [("mappo-continuous", colour["mappo-continuous"])],
    }
    curve_styles = {style for rows in panels.values() for _, _, style in rows}
    assert make_readme.REFERENCE_STYLE not in curve_styles | set(make_readme.VARIANT_STYLES)
    # and the figure shows them: the same curves with the published figures give another PNG
    real = [json.loads((RESULTS / "simple_spread_v3" / f"{a}.json").read_text()) for a in ("maddpg", "mappo")]
    published = [r for r in make_readme.load_references(make_readme.REFERENCE_FILE) if r["algo"] == "maddpg"]
    make_readme.plot_curves("simple_spread_v3", real, tmp_path / "without.png")
    make_readme.plot_curves("simple_spread_v3", real, tmp_path / "with.png", published)
    assert (tmp_path / "without.png").read_bytes() != (tmp_path / "with.png").read_bytes()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(protocol="v1"), "protocol 'v1', expected 'v2'"),
        (dict(mean=None), "'mean' is not a number"),
        (dict(returns=[-9.0]), "1 returns for 2 episodes"),
    ],
)
def test_a_final_eval_that_is_not_protocol_v2_is_refused_by_name(tmp_path, change, message):
    final = dict(protocol="v2", episodes=2, seed=10_000, global_step=1000, mean=-10.0, std=1.0,
                 returns=[-9.0, -11.0], per_group={"agent": -10.0})  # fmt: skip
    path = tmp_path / "final_eval.json"
    path.write_text(json.dumps(final))
    assert collect.read_final_eval(path) == dict(
        mean=-10.0, std=1.0, episodes=2, protocol="v2", per_group=final["per_group"]
    )
    path.write_text(json.dumps(final | change))
    with pytest.raises(collect.CollectError, match=message) as error:
        collect.read_final_eval(path)
    assert str(path) in str(error.value)


def test_notes_beside_an_envs_results_are_linked_from_its_section(tmp_path):
    (tmp_path / "simple_spread_v3").mkdir()
    for name in ("tuning.md", "tournament.md"):
        (tmp_path / "simple_spread_v3" / name).write_text("# a page\n")
    text = make_readme.generate(tmp_path).read_text()
    section = text[text.index("## simple_spread_v3") :]
    assert "[simple_spread_v3/tuning.md](simple_spread_v3/tuning.md)" in section.split("\n## ")[0]
    assert "](simple_spread_v3/tournament.md)" not in section.split("## Tournaments")[0]  # nested there instead


def test_a_tournament_page_is_nested_in_the_readme_with_its_heatmap(tmp_path):
    (tmp_path / "battle_v4").mkdir()
    page = "# Tournament on battle_v4\n\n![score matrix](tournament.png)\n"
    (tmp_path / "battle_v4" / "tournament.md").write_text(page)
    text = make_readme.generate(tmp_path).read_text()
    assert "## Tournaments" in text and "### Tournament on battle_v4" in text
    assert "![score matrix](battle_v4/tournament.png)" in text
    assert "in the notes beside it" not in text.split("## Tournaments")[1]  # no notes beside it: nothing to link
    (tmp_path / "battle_v4" / "protocol.md").write_text("# who beats whom\n")
    nested = make_readme.generate(tmp_path).read_text().split("## Tournaments")[1]
    assert "in the notes beside it: [battle_v4/protocol.md](battle_v4/protocol.md)." in nested


def test_the_overview_puts_each_scripts_row_per_task_side_by_side_with_its_budget_matrix_rows_first(tmp_path):
    out = tmp_path / "results"
    for env, algo in [
        ("simple_spread_v3", "qmix"),
        ("simple_spread_v3", "maddpg-tf64"),
        ("simple_reference_v3", "vdac"),
    ]:
        (out / env).mkdir(parents=True, exist_ok=True)
        shutil.copy(RESULTS / env / f"{algo}.json", out / env)
    vdac = json.loads((out / "simple_reference_v3" / "vdac.json").read_text())
    vdac["config"] = dict(vdac["config"], feature_norm="none")  # made with an older default of the script
    (out / "simple_reference_v3" / "vdac.json").write_text(json.dumps(vdac))
    text = make_readme.generate(out).read_text()
    table = text.split("## MPE at a glance")[1].split("\n## ")[0]
    assert "| task | `qmix` | `vdac` |" in table  # one column per script, in the matrix's order; no variant column
    qmix_result = json.loads((out / "simple_spread_v3" / "qmix.json").read_text())
    qmix = qmix_result["summary"]["final_policy"]
    assert f"| simple_spread_v3 | {qmix['mean']:.2f} ± {qmix['std']:.2f} (10M) | — |" in table
    assert "| simple_reference_v3 | — | " in table and "(2M, stale) |" in table  # its default changed since
    matrix = dict(qmix_result, algo="qmix-3m", total_timesteps=3_000_000)  # the matrix's row takes the cell
    matrix["summary"] = dict(qmix_result["summary"], final_policy=dict(qmix, mean=-7.0))
    (out / "simple_spread_v3" / "qmix-3m.json").write_text(json.dumps(matrix))
    table = make_readme.generate(out).read_text().split("## MPE at a glance")[1].split("\n## ")[0]
    assert f"| simple_spread_v3 | -7.00 ± {qmix['std']:.2f} (3M) | — |" in table
    assert "--total-timesteps 3000000 --variant 3m" in table
    matrix["config"] = dict(matrix["config"], gamma=0.5)  # made with another default of the script
    (out / "simple_spread_v3" / "qmix-3m.json").write_text(json.dumps(matrix))
    table = make_readme.generate(out).read_text().split("## MPE at a glance")[1].split("\n## ")[0]
    assert f"| simple_spread_v3 | -7.00 ± {qmix['std']:.2f} (3M, stale) | — |" in table


@pytest.mark.parametrize(
    "task, name, alt",
    [("simple_spread_v3", "OVERVIEW_NAME", "cooperative MPE tasks"),
     ("Foraging-8x8-2p-2f-coop", "BENCHMARK_PLOT_NAME", "the EPyMARL benchmark")],
)  # fmt: skip
def test_the_overview_heatmaps_draw_their_tasks_byte_identically_and_go_when_they_go(tmp_path, task, name, alt):
    out = tmp_path / "results"
    (out / task).mkdir(parents=True)
    shutil.copy(RESULTS / task / ("qmix.json" if task.startswith("simple") else "mappo.json"), out / task)
    text = make_readme.generate(out).read_text()
    png = out / getattr(make_readme, name)
    assert png.is_file() and f"![{alt} at a glance]({png.name})" in text
    first = png.read_bytes()
    make_readme.generate(out)
    assert png.read_bytes() == first  # the same JSON gives the same bytes
    shutil.rmtree(out / task)  # no such result left: no heatmap, no link to one
    assert png.name not in make_readme.generate(out).read_text() and not png.exists()


def test_the_matrix_commands_run_every_overview_script_on_the_tasks_it_accepts():
    scripts = {}  # algo -> the tasks its command gives it
    for command in make_readme.MATRIX_COMMANDS:
        words = command.split()
        algos, envs = words[words.index("--algos") + 1].split(","), words[words.index("--envs") + 1].split(",")
        for algo in algos:
            assert (ROOT / "algos" / f"{algo}.py").exists() and algo not in scripts
            scripts[algo] = set(envs)
    assert set(scripts) == set(make_readme.MATRIX_ORDER)
    assert all(len(envs) == 9 or envs == set(make_readme.COOPERATIVE_TASKS) for envs in scripts.values())
    from envs.registry import REGISTRY

    assert all(REGISTRY[env].family == "mpe" for env in make_readme.MPE_TASKS)


def test_crossplay_pages_are_nested_in_the_readme_and_their_json_is_not_read_as_a_result(local_sweep, tmp_path):
    out = tmp_path / "results"
    shutil.copytree(local_sweep[0], out)
    (out / "env_x" / "crossplay.json").write_text(json.dumps({"env_id": "env_x", "per_seed": {}}))
    (out / "env_x" / "crossplay.md").write_text("# Cross-play on env_x\n\n| | `a` |\n")
    text = make_readme.generate(out).read_text()
    assert "## Cross-play\n\nFrom [env_x/crossplay.md](env_x/crossplay.md):\n\n### Cross-play on env_x" in text
    assert "Notes on env_x" not in text  # not linked as a screen
    assert [p.name for p in collect.result_paths(out)] == ["fake_a.json", "fake_b.json"]


# ---------------------------------------------------------------------------------------------------
# Bad inputs to the results tools: one line that names the flag, file or field, and nothing counted twice or lost
# ---------------------------------------------------------------------------------------------------


def test_run_refuses_extra_flags_a_script_of_the_sweep_does_not_take(capsys):
    """--extra '--rnn' on a sweep of mappo and qmix (always recurrent: no --rnn) failed every qmix run at its start,
    one FAILED line a run; a typo in --extra failed them all."""
    base = ["--algos", "mappo,qmix", "--envs", "simple_spread_v3", "--total-timesteps", "7", "--dry-run"]
    for extra, says in (("--rnn", "algos/qmix.py refuses it (Unrecognized options: --rnn)"),
                        ("--num-envz 3", "algos/mappo.py refuses it (Unrecognized options: --num-envz, 3)"),
                        ("--num-envs x", "algos/mappo.py refuses it (Error parsing --num-envs: invalid")):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            sweep_runner.parse_args([*base, "--extra", extra])
        assert e.value.code == 2 and f"error: --extra '{extra}': {says}" in capsys.readouterr().err
    assert sweep_runner.parse_args([*base, "--extra", "--eval-episodes 100 --no-continuous-actions"]).extra_argv


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--extra", "--seed 7"], "--extra sets --seed, which run.py gives every run itself: use run.py's --seeds"),
        (["--extra=--total_timesteps=5"], "--extra sets --total-timesteps, which run.py gives every run itself"),
        (["--extra", "--run-dir x"], "--extra sets --run-dir, which run.py gives every run itself: use run.py's --out"),
        (["--extra", "--env simple_tag_v3"], "--extra sets --env, which run.py gives every run itself: use run.py's"),
        (["--extra", "--resume x"], "--extra sets --resume, which run.py gives every run itself: launch the same"),
        (["--extra", '--env-kwargs \'{"N": "a'], "--extra '--env-kwargs \\'{\"N\": \"a': No closing quotation"),
        (["--workers", "-1"], "--workers -1: must be >= 1 (without it: one run per CPU)"),
        (["--workers", "0"], "--workers 0: must be >= 1 (without it: one run per CPU)"),
        (["--threads-per-run", "0"], "--threads-per-run 0: must be >= 1 (without it: the CPUs shared out)"),
        (["--timeout", "-1"], "--timeout -1: must be > 0 seconds (without it: no limit)"),
        (["--ray", "--gpus-per-run", "-1"], "--cpus-per-run 1 must be > 0 and --gpus-per-run -1 >= 0"),
        (["--out", "/dev/null/results"], "--out /dev/null/results: /dev/null is not a folder this user can write in"),
    ],
)
def test_run_refuses_bad_flags_in_one_line(flags, message, capsys):
    """A --seed in --extra trained seed 7 and recorded seed 0; --workers -1 was a ValueError traceback and 0 silently
    the CPU count; an unbalanced quote in --extra a shlex traceback; --threads-per-run 0 left every run's threads
    unset; --timeout -1 killed every run at once; an --out under a file was a NotADirectoryError traceback."""
    argv = ["--algos", "fake_a", "--envs", "env_x", "--total-timesteps", "7", "--algos-dir", str(FAKES), *flags]
    with pytest.raises(SystemExit) as e:
        sweep_runner.parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"error: {message}" in err and "Traceback" not in err, err
    (run,) = sweep_runner.plan(sweep_runner.parse_args([*argv[:8], "--seeds", "0,", "--extra", "--env-kwargs {}"]))
    assert run.argv[-2:] == ["--env-kwargs", "{}"]  # a flag that merely starts like --env is the script's


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--out", "{tmp}/nowhere"], "--out {tmp}/nowhere: no such folder (a results root holds <env_id>/<algo>.json)"),
        (["--out", "{tmp}", "--reference", "{tmp}/ref.json"], "--reference {tmp}/ref.json: no such file"),
    ],
)
def test_make_readme_refuses_a_missing_results_root_or_reference_file(flags, message, tmp_path, capsys):
    """A mistyped --out made that folder and wrote an empty README.md into it; a mistyped --reference dropped every
    published figure from the page without a word."""
    with pytest.raises(SystemExit) as e:
        make_readme.main([f.format(tmp=tmp_path) for f in flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"error: {message.format(tmp=tmp_path)}" in err, err
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "README.md").exists()


def test_collect_with_a_typo_in_envs_names_the_envs_there(local_sweep, tmp_path, capsys):
    """--envs env_y said only "no finished runs under .../runs", as if the sweep had not run."""
    out = tmp_path / "results"
    shutil.copytree(local_sweep[0], out)
    assert collect.main(["--out", str(out), "--envs", "env_y", "--algos", "fake_a"]) == 1
    err = capsys.readouterr().err
    assert f"no finished runs of --envs env_y and --algos fake_a under {out / 'runs'} (the envs there: env_x)" in err


def test_collect_refuses_a_copied_run_directory_naming_both(local_sweep, tmp_path, capsys):
    """A copy of seed1's directory as seed2 counted as a third seed of the same run; a directory whose name is not
    the seed it trained would record a seed that never ran. Both are refused, and the result file stays as it was."""
    out = tmp_path / "results"
    shutil.copytree(local_sweep[0], out)
    runs, before = out / "runs" / "env_x" / "fake_a", (out / "env_x" / "fake_a.json").read_text()
    shutil.copytree(runs / "seed1", runs / "seed2")
    assert collect.main(["--out", str(out), "--algos", "fake_a"]) == 1
    err = capsys.readouterr().err
    both = f"{runs / 'seed1'} and {runs / 'seed2'} both trained with --seed 1 (config.json): one run twice"
    assert f"error: env_x/fake_a: {both}" in err and (out / "env_x" / "fake_a.json").read_text() == before
    (runs / "seed1").rename(runs / "seed3")  # only the copy is left, under another seed's name
    shutil.rmtree(runs / "seed2")
    assert collect.main(["--out", str(out), "--algos", "fake_a"]) == 1
    assert f"{runs / 'seed3'} trained with --seed 1 (config.json), not the seed 3 it names" in capsys.readouterr().err


def test_collect_names_a_garbled_or_missing_config_instead_of_taking_the_other_seeds(local_sweep, tmp_path, capsys):
    """A config.json that does not parse was dropped without a word, and the other seed's config stood for both."""
    out = tmp_path / "results"
    shutil.copytree(local_sweep[0], out)
    config = out / "runs" / "env_x" / "fake_a" / "seed0" / "config.json"
    config.write_text('{"seed": 0, "num_envs": 4')
    assert collect.main(["--out", str(out), "--algos", "fake_a"]) == 1
    err = capsys.readouterr().err
    assert f"error: env_x/fake_a: {config}: unreadable (Expecting ',' delimiter" in err
    assert "so the run's flags are unknown" in err
    config.write_text("[0]")
    assert collect.main(["--out", str(out), "--algos", "fake_a"]) == 1
    assert f"{config}: a JSON list, not an object of flags" in capsys.readouterr().err
    config.unlink()
    assert collect.main(["--out", str(out), "--algos", "fake_a"]) == 1
    assert f"{config}: missing, so the run's flags are unknown" in capsys.readouterr().err


def test_collect_keeps_the_flags_as_recorded_and_rounds_only_the_measurements(local_sweep, tmp_path):
    """Every float of a result was rounded to 6 decimals, the flags with them: coma's --actor-adam-eps 1e-8 became
    0.0 in rware-tiny-4ag/coma.json, and make_readme called the row stale (its command today gives 1e-8)."""
    out = tmp_path / "results"
    shutil.copytree(local_sweep[0], out)
    for seed, config in enumerate(sorted((out / "runs" / "env_x" / "fake_a").glob("seed*/config.json"))):
        flags = {"adam_eps": 1e-8, "checkpoint_minutes": (seed + 1) * 1e-7}  # the second may differ between seeds
        config.write_text(json.dumps(json.loads(config.read_text()) | flags))
    assert collect.main(["--out", str(out), "--algos", "fake_a"]) == 0
    result = load(out, "fake_a")
    assert result["config"]["adam_eps"] == 1e-8
    assert result["config_per_seed"]["checkpoint_minutes"] == {"0": 1e-7, "1": 2e-7}
    assert collect.clean_json({"x": [1 / 3, np.float32(0.5)]}) == {"x": [0.333333, 0.5]}  # measurements: 6 decimals


def _write_many(out: str, result: dict, times: int) -> None:
    for _ in range(times):
        collect.write_result(result, Path(out))


def test_two_sweeps_writing_one_row_at_once_both_finish_and_leave_it_whole(local_sweep, tmp_path):
    """Sweeps over the same runs (run.py shares them) end together and write the same row: both wrote it through one
    file name, `<algo>.json.tmp`, so the first's rename took the file the second was still writing, and the second's
    rename failed (FileNotFoundError)."""
    result = load(local_sweep[0], "fake_a")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        writers = [pool.submit(_write_many, str(tmp_path), result, 300) for _ in range(2)]
        for writer in writers:
            writer.result()  # raises what a writer raised
    assert json.loads((tmp_path / "env_x" / "fake_a.json").read_text()) == result
    assert sorted(p.name for p in (tmp_path / "env_x").iterdir()) == ["fake_a.json"]  # no temporary file left


def test_collect_refuses_seeds_of_different_configurations_under_one_label(local_sweep, tmp_path, capsys):
    """A sweep that adds seeds after a default changed collects the earlier seeds too (earlier_seeds): one row then
    averaged two configurations, the difference only in the JSON's config_per_seed. Refused, naming the flag (also one
    that only some seeds recorded: the others ran before it existed); how a seed ran (--cuda, threads) may differ."""
    out = tmp_path / "results"
    shutil.copytree(local_sweep[0], out)
    runs, before = out / "runs" / "env_x" / "fake_a", (out / "env_x" / "fake_a.json").read_text()
    config = runs / "seed1" / "config.json"
    recorded = json.loads(config.read_text())
    config.write_text(json.dumps(recorded | {"cuda": True, "torch_threads": 4}))
    assert collect.main(["--out", str(out), "--algos", "fake_a"]) == 0
    assert load(out, "fake_a")["config_per_seed"]["cuda"] == {"0": None, "1": True}  # the fake records no --cuda
    (out / "env_x" / "fake_a.json").write_text(before)
    for change, said in [
        ({"num_envs": 8}, "num_envs: seed 0 4, seed 1 8"),
        ({"critic": "v"}, 'critic: seed 0 absent, seed 1 "v"'),
    ]:
        config.write_text(json.dumps(recorded | change))
        assert collect.main(["--out", str(out), "--algos", "fake_a"]) == 1
        err = capsys.readouterr().err
        assert f"error: env_x/fake_a: its seeds ran different configurations ({said})" in err
        assert "--variant" in err and (out / "env_x" / "fake_a.json").read_text() == before


def test_a_result_of_runs_started_by_hand_says_it_has_no_command_and_is_not_stale(local_sweep, tmp_path, monkeypatch):
    """Without a recorded command the drift check read stdin (shlex.split(None)) and, given none, called the row
    stale: "script `[]` no longer exists"."""
    out = tmp_path / "results"
    shutil.copytree(local_sweep[0], out)
    for record in (out / "runs" / "env_x" / "fake_a").glob("seed*/run.json"):
        record.unlink()  # as the script leaves its directory when started by hand
    assert collect.main(["--out", str(out), "--algos", "fake_a"]) == 0
    result = load(out, "fake_a")
    assert [p["command"] for p in result["per_seed"]] == [None, None] and not result["commands"]

    class NoStdin:
        def read(self, *args):
            raise AssertionError("make_readme read stdin")

        readline = read

    monkeypatch.setattr(sys, "stdin", NoStdin())
    assert make_readme.config_drift(result) is None
    text = make_readme.generate(out).read_text()
    assert "Stale: `fake_a`" not in text and "no longer exists" not in text
    assert "`fake_a`: its runs recorded no command (started by hand, not by results/run.py)" in text
    assert "python results/run.py" in text  # fake_b's command is still shown


def test_the_readme_lists_a_command_once_whatever_the_order_of_its_flags(local_sweep, tmp_path):
    """The EPyMARL peer's QMIX row was launched with its flags in two orders, and its README listed it twice."""
    out = tmp_path / "results"
    shutil.copytree(local_sweep[0], out)
    command = load(out, "fake_a")["sweep_commands"][0]
    head, *flags = command.split(" --")
    assert len(flags) >= 4
    reordered = " --".join([head, *reversed(flags)])
    other = command.replace("--num-envs 4", "--num-envs 8")
    assert other != command
    record = load(out, "fake_b")
    record["sweep_commands"] = [reordered, other]
    (out / "env_x" / "fake_b.json").write_text(json.dumps(record))
    text = make_readme.generate(out).read_text()
    assert text.count(command) == 1 and reordered not in text and text.count(other) == 1
    swapped = ("run.py --extra '--x 1 --y' --more '--z 2 --w'", "run.py --extra '--z 2 --w' --more '--x 1 --y'")
    assert make_readme.same_command(swapped[0]) != make_readme.same_command(swapped[1])


def test_crossplay_names_a_cached_record_it_cannot_use_and_plays_every_pair_again(tmp_path, capsys):
    """A crossplay.json of the same settings without `per_seed` was a KeyError."""
    import crossplay

    settings = dict(env_id="simple_tag_v3", seeds=[0], teams=[["adversary"], ["agent"]], episodes=4, backend="numba")
    digests = {"mappo-3m/seed0": "d0", "ippo-3m/seed0": "d1"}
    cached = tmp_path / "crossplay.json"
    cached.write_text(json.dumps(dict(settings, commit="c" * 40, digests=digests)))
    assert crossplay.earlier_pairs(cached, settings, digests) == ({}, [])
    assert f"note: {cached}: no 'per_seed' (each pair's list of per-seed returns); every pair is played again" in (
        capsys.readouterr().err
    )
    cached.write_text("{")
    assert crossplay.earlier_pairs(cached, settings, digests) == ({}, [])
    assert f"note: {cached}: unreadable (" in capsys.readouterr().err
    runs = [{"adversary": 1.0, "agent": -1.0}]
    cached.write_text(json.dumps(dict(settings, digests=digests, per_seed={"mappo-3m vs ippo-3m": runs})))
    one = [dict(commit=None, seconds=None, pairs=None)]  # a record from before `launches`: one launch, pairs unknown
    assert crossplay.earlier_pairs(cached, settings, digests) == ({"mappo-3m vs ippo-3m": (runs, "unknown")}, one)
    assert crossplay.earlier_pairs(tmp_path / "none.json", settings, digests) == ({}, [])
    assert capsys.readouterr().err == ""  # a first cross-play, or one that is usable: no line


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--seeds", "0,0"], "--seeds '0,0': seed 0 given twice; each seed pairs once"),
        (["--seeds", "0,x"], "--seeds '0,x': expected comma-separated integers"),
        (["--env-id", "simple_tga_v3"], "--env-id 'simple_tga_v3' is not an env id of envs.make (envs.known_ids())"),
        (["--variant", "a/b"], "--variant 'a/b' names a folder of --runs: no '/' in it"),
        (["--env-id", "simple_spread_v3"], "the env has one group ['agent']: cross-play needs two teams"),  # not "no
    ],  # checkpoint ...: train the rows first", nor "--teams agent/"
)
def test_crossplay_refuses_a_seed_given_twice_a_typo_in_the_env_and_a_path_as_variant(flags, message, tmp_path, capsys):
    """--seeds 0,0 played every pair twice and reported two seeds; a typo in --env-id was told to train its rows first
    ("no checkpoint ..."), as were a --variant that reached into other folders and a cooperative env."""
    import crossplay

    argv = ["--env-id", "simple_tag_v3", "--algos", "mappo,ippo", "--runs", str(tmp_path), *flags]
    assert crossplay.main(argv) == 2
    assert f"error: {message}" in capsys.readouterr().err
    assert crossplay.parse_seeds("2, 0,1") == [2, 0, 1]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ("[12]", "--env-kwargs must be a JSON object such as '{\"map_size\": 45}', not '[12]'"),
        ("{map_size: 12}", "--env-kwargs is not valid JSON (Expecting property name"),
    ],
)
def test_tournament_says_env_kwargs_must_be_a_json_object(kwargs, message, capsys):
    """--env-kwargs '[12]' was a TypeError traceback from the env's constructor."""
    import tournament

    assert tournament.main(["--env", "battle_v4", "--random", "--env-kwargs", kwargs]) == 2
    assert f"error: {message}" in capsys.readouterr().err


def test_tournament_names_its_own_flag_for_a_bad_player(capsys):
    """--player 'mappo0' (no =PATH) was refused as "--opponent 'mappo0' is not GROUP=PATH", a flag it does not have."""
    import tournament

    assert tournament.main(["--env", "battle_v4", "--random", "--player", "mappo0"]) == 2
    err = capsys.readouterr().err
    assert "error: --player 'mappo0' is not NAME=PATH (e.g. mappo0=runs/x/last.pt, or mappo0=runs/x/last.pt@red" in err
