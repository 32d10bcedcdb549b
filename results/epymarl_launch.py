"""EPyMARL's own src/main.py, its code unchanged, with what our peer needs to stop a seed and resume it.

results/epymarl_peer.py runs this file with EPyMARL's interpreter, in EPyMARL's checkout, with main.py's arguments:

    cd ~/epymarl && ~/epymarl/.venv/bin/python <this file> --config=qmix --env-config=gymma with ...

It imports nothing of ours (EPyMARL's environment is not ours) and changes no step of training. Three hooks:
* Whenever EPyMARL saves its models (every `save_model_interval` steps), `peer_state.pt` goes beside them: what its
  own checkpoint leaves out, the learner's target networks, running reward statistics and update counters, and the
  replay buffer's episodes. Only the newest save of a run keeps one (the buffer can take a gigabyte on RWARE).
* On SIGTERM or SIGINT the run finishes the episode and update it is in, saves at its step and exits with STOPPED
  (75), sacred's record of it marked INTERRUPTED. So it does when the driver that started it is gone (killed
  outright: this process runs in its own session, and would otherwise train on with nobody to resume it).
* When training ends it saves once more, at its last step: EPyMARL's last periodic save can be up to
  `save_model_interval` steps old, and the peer plays the agent saved last.
On a resume (EPyMARL's `checkpoint_path` and `load_step`) EPyMARL loads its models and optimiser and sets its step
counter, as it always does; the learner's state and the buffer then come back from peer_state.pt. What a resume
still loses: the random number streams (restarted from the seed) and the runner's episode count (logging only).
"""

import os
import runpy
import signal
import sys
from pathlib import Path

STATE_NAME = "peer_state.pt"
STOPPED = 75  # the exit status of a run stopped by a signal, after its save (EX_TEMPFAIL: run it again to resume)

SRC = Path.cwd() / "src"
sys.path.insert(0, str(SRC))  # as `python src/main.py` would have it

import torch  # noqa: E402
from components.episode_buffer import ReplayBuffer  # noqa: E402
from learners import REGISTRY as LEARNERS  # noqa: E402
from runners import REGISTRY as RUNNERS  # noqa: E402

MAIN_PID, PARENT_PID = os.getpid(), os.getppid()  # the parent: the driver, results/epymarl_peer.py
live = {}  # this run's learner and replay buffer, once EPyMARL has built them
stop_requested = []


def learner_state(learner) -> dict:
    """What EPyMARL's save_models leaves out: target networks (a MAC holds its network as .agent), running
    statistics (RunningMeanStd: mean, var, count) and the numbers that schedule updates and target copies."""
    state = {}
    for name, value in vars(learner).items():
        network = getattr(value, "agent", value)
        if name.startswith("target_") and hasattr(network, "state_dict"):
            state[name] = network.state_dict()
        elif type(value).__name__ == "RunningMeanStd":
            state[name] = {"mean": value.mean, "var": value.var, "count": value.count}
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            state[name] = value
    return state


def restore_learner(learner, state: dict) -> None:
    for name, value in state.items():
        current = getattr(learner, name)
        if isinstance(value, dict) and name.startswith("target_"):
            getattr(current, "agent", current).load_state_dict(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                setattr(current, key, item)
        else:
            setattr(learner, name, value)


def buffer_state(buffer: ReplayBuffer) -> dict:
    n = buffer.episodes_in_buffer
    data = {k: v[:n].clone() for k, v in buffer.data.transition_data.items()}
    episode = {k: v[:n].clone() for k, v in buffer.data.episode_data.items()}
    return {"transition_data": data, "episode_data": episode, "buffer_index": buffer.buffer_index, "episodes": n}


def restore_buffer(buffer: ReplayBuffer, state: dict) -> None:
    n = state["episodes"]
    for part in ("transition_data", "episode_data"):
        for key, value in state[part].items():
            getattr(buffer.data, part)[key][:n] = value
    buffer.buffer_index, buffer.episodes_in_buffer = state["buffer_index"], n


def with_peer_state(cls) -> None:
    """A learner class whose save_models also writes peer_state.pt and whose load_models reads it back."""
    if getattr(cls, "_peer_hooked", False):
        return
    init, save, load = cls.__init__, cls.save_models, cls.load_models

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        live["learner"] = self

    def save_models(self, path):
        save(self, path)
        state = {"learner": learner_state(self)}
        if "buffer" in live:
            state["buffer"] = buffer_state(live["buffer"])
        torch.save(state, Path(path) / STATE_NAME)
        for older in Path(path).parent.glob(f"*/{STATE_NAME}"):  # the run's earlier saves keep their models only
            if older.parent != Path(path):
                older.unlink()

    def load_models(self, path):
        load(self, path)
        saved = Path(path) / STATE_NAME
        if saved.is_file():
            state = torch.load(saved, map_location="cpu", weights_only=True)
            restore_learner(self, state["learner"])
            if "buffer" in state and "buffer" in live:
                restore_buffer(live["buffer"], state["buffer"])

    cls.__init__, cls.save_models, cls.load_models, cls._peer_hooked = __init__, save_models, load_models, True


def save_now(runner) -> None:
    path = os.path.join(runner.args.local_results_path, "models", runner.args.unique_token, str(runner.t_env))
    os.makedirs(path, exist_ok=True)
    live["learner"].save_models(path)


def with_stop_and_final_save(cls) -> None:
    """A runner class that saves and exits at the next training episode after a signal, and saves when closed (the
    end of training)."""
    if getattr(cls, "_peer_hooked", False):
        return
    run, close_env = cls.run, cls.close_env

    def run_hooked(self, test_mode=False):
        if os.getppid() != PARENT_PID and not stop_requested:  # the driver was killed: nobody would resume us
            stop_requested.append("the driver's end")
        if stop_requested and not test_mode and "learner" in live:
            save_now(self)
            print(f"stopped by {stop_requested[0]} at t_env {self.t_env}: saved, exiting", flush=True)
            raise KeyboardInterrupt  # sacred writes its last heartbeat (the metrics) and marks the run INTERRUPTED
        return run(self, test_mode=test_mode)

    def close_env_hooked(self):
        if "learner" in live:
            save_now(self)
        close_env(self)

    cls.run, cls.close_env, cls._peer_hooked = run_hooked, close_env_hooked, True


def on_signal(signum, frame) -> None:
    if os.getpid() != MAIN_PID:  # an env worker of the parallel runner: end as it would have without us
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    stop_requested.append(f"signal {signum}")


def install_hooks() -> None:
    """The hooks on EPyMARL's learner and runner classes and its replay buffer (each class hooked once)."""
    for cls in set(LEARNERS.values()):
        with_peer_state(cls)
    for cls in set(RUNNERS.values()):
        with_stop_and_final_save(cls)
    if getattr(ReplayBuffer, "_peer_hooked", False):
        return
    buffer_init = ReplayBuffer.__init__

    def buffer_init_hooked(self, *args, **kwargs):
        buffer_init(self, *args, **kwargs)
        live["buffer"] = self

    ReplayBuffer.__init__, ReplayBuffer._peer_hooked = buffer_init_hooked, True


def main() -> None:
    install_hooks()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sys.argv = [str(SRC / "main.py"), *sys.argv[1:]]
    try:
        runpy.run_path(str(SRC / "main.py"), run_name="__main__")
    except KeyboardInterrupt:
        if not stop_requested:
            raise
        sys.exit(STOPPED)


if __name__ == "__main__":
    main()
