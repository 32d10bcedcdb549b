"""Checkpoints: one contract for every script.

A checkpoint is a dict that `torch.load(..., weights_only=True)` accepts:

    algo, env_id, signature   what it was trained on (the env's groups and spaces: `env_signature`)
    args                      every flag, as JSON types
    global_step, evals, best_eval, counters   where the run stands (counters: the script's own, e.g. iteration)
    nets, optimizers          name -> state_dict
    rng                       {"torch": ByteTensor, "numpy": bit-generator state}

Writes are atomic and durable (temporary file, fsync, rename, fsync of the directory: `write_whole`, which the run
also writes its final_eval.json and replay.npz with), refuse non-finite weights, and hold off SIGINT/SIGTERM until
the file is in place, so a second Ctrl-C cannot cut a write short. Loads check the algorithm, env, signature and the
network-shaping flags, and name whatever differs, in one line.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Callable
from typing import BinaryIO

import numpy as np
import torch

REQUIRED = ("algo", "env_id", "signature", "args", "global_step", "evals", "best_eval", "counters", "nets",
            "optimizers", "rng")  # fmt: skip
SIGNALS = {signal.SIGINT, signal.SIGTERM}


class CheckpointError(ValueError):
    """A checkpoint that cannot be used as asked; the message names the file and what is wrong."""


def tensors(tree):
    """Every tensor inside nested dicts/lists (state dicts, optimizer states)."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from tensors(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from tensors(v)


def non_finite(nets: dict) -> list[str]:
    """Names of the state-dict entries of `nets` (name -> state_dict) that hold NaN or inf."""
    return [f"{name}.{k}" for name, sd in nets.items() for k, v in sd.items()
            if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()]  # fmt: skip


@contextlib.contextmanager
def signals_deferred():
    """SIGINT/SIGTERM that arrive inside the block are recorded and re-raised after it, so nothing cuts it short."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread handles signals
        yield
        return
    pending = []
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum in pending:
            signal.raise_signal(signum)


def save_checkpoint(path: str, ckpt: dict) -> None:
    """Write `ckpt` to `path` atomically and durably; the previous file stays intact if anything fails."""
    if bad := non_finite(ckpt["nets"]):
        raise FloatingPointError(f"not writing {path}: the weights {bad[:3]} are not finite")
    with signals_deferred():  # a Ctrl-C now waits until the file is in place
        write_whole(path, lambda f: torch.save(ckpt, f))


def write_whole(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Write `path` whole or not at all, durably: `write(f)` fills `<path>.tmp`, which is fsynced and renamed over
    `path`, and the directory fsynced, so the rename survives a power cut. A run's files have one writer (the run
    holds its directory's lock): a write cut short by a kill leaves `<path>.tmp` behind, and the next write replaces
    it. On an OSError (a full disk) the temporary file goes and the error says what to do."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a power cut
        finally:
            os.close(fd)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise OSError(f"could not write {path} ({e.strerror or e}); the previous {os.path.basename(path)}, if any, "
                      f"is intact: free space or pick another --run-dir, then --resume") from None  # fmt: skip


def copy_policy(path: str, copy: str) -> None:
    """A copy of checkpoint `path` at `copy` without its optimizer states: the weights and flags that a player needs
    (results/tournament.py and results/crossplay.py keep final policies this way, a fraction of the run's files)."""
    ckpt = read_checkpoint(path)
    ckpt["optimizers"] = {}
    ckpt.pop("env_state", None), ckpt.pop("loop", None)  # where the run stood: no player needs it
    os.makedirs(os.path.dirname(os.path.abspath(copy)), exist_ok=True)
    save_checkpoint(copy, ckpt)


def not_a_checkpoint_file(path: str) -> str | None:
    """Why `path` cannot be read as a checkpoint, or None when it is a file: a run's folder named in place of one of
    its checkpoints is told which files it holds."""
    if os.path.isfile(path):
        return None
    if os.path.isdir(path):
        held = sorted(name for name in os.listdir(path) if name.endswith(".pt"))
        return f"a folder, not a checkpoint file: name one in it ({', '.join(held) or 'it holds no .pt file'})"
    return "checkpoint does not exist"


def load_failure(e: Exception) -> str:
    """torch.load's reason in one clause. Its weights-only refusal buries the unpickler's complaint in a paragraph
    that advises weights_only=False, which these scripts never do: the complaint alone is kept."""
    text = str(e).strip()
    if isinstance(e, EOFError):
        return "the file ends early (empty or cut short)"
    if found := re.search(r"WeightsUnpickler error:\s*(.+?)(?: was not an allowed global.*)?$", text, re.M):
        return f"weights-only loading refused it ({found.group(1).strip()})"
    return text.splitlines()[0] if text else type(e).__name__


def read_checkpoint(path: str) -> dict:
    """torch.load(weights_only=True) with every failure turned into one CheckpointError line."""
    if problem := not_a_checkpoint_file(path):
        raise CheckpointError(f"{path}: {problem}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a damaged or foreign file
        raise CheckpointError(
            f"checkpoint {path} is unreadable (corrupt or not a torch file): {load_failure(e)}"
        ) from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"checkpoint {path} is not a checkpoint of these scripts (a {type(ckpt).__name__})")
    return ckpt


ENV_FLAGS = ("env_kwargs", "continuous_actions", "max_cycles", "map_size")  # the flags that shape an env's spaces


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def load_checkpoint(path: str, algo: str, args, signature: dict, network_flags=(), same_flags=()) -> dict:
    """Read and validate a checkpoint of `algo` for this env and these flags.

    `network_flags` shape the networks, `same_flags` shape the run (e.g. --num-envs on --resume): each that differs
    between the checkpoint and `args` is named in the error.
    """
    ckpt = read_checkpoint(path)
    if ckpt.get("algo") != algo:
        raise CheckpointError(f"checkpoint {path} is not a {algo} checkpoint (algo: {ckpt.get('algo')!r})")
    if missing := [k for k in REQUIRED if k not in ckpt]:
        raise CheckpointError(f"checkpoint {path} is malformed: it lacks {missing} (damaged, or written by an "
                              f"older version of {algo}.py)")  # fmt: skip
    if not isinstance(ckpt["args"], dict) or not isinstance(ckpt["nets"], dict):
        raise CheckpointError(f"checkpoint {path} is malformed: 'args' and 'nets' must be dicts")
    env_differ = [f"{flag(k)} {ckpt['args'][k]!r} (checkpoint) vs {getattr(args, k)!r} (now)" for k in ENV_FLAGS
                  if k in ckpt["args"] and _jsonable(getattr(args, k, None)) != ckpt["args"][k]]  # fmt: skip
    if ckpt["env_id"] == args.env_id and ckpt["signature"] != signature and env_differ:  # the flags that made it
        raise CheckpointError(f"checkpoint {path} was trained on {args.env_id} with other env flags: "
                              f"{'; '.join(env_differ)}: pass the checkpoint's values")  # fmt: skip
    if ckpt["env_id"] != args.env_id or ckpt["signature"] != signature:
        raise CheckpointError(
            f"checkpoint {path} was trained on {ckpt['env_id']} with spaces {ckpt['signature']}, which do not match "
            f"{args.env_id} with {signature}: pass the same --env-id and env flags"
        )
    differ = [f"{flag(k)} {ckpt['args'].get(k)!r} (checkpoint) vs {getattr(args, k)!r} (now)"
              for k in (*network_flags, *same_flags)
              if k in ckpt["args"] and _jsonable(getattr(args, k)) != ckpt["args"][k]]  # fmt: skip
    if differ:
        raise CheckpointError(f"checkpoint {path} was made with other flags: {'; '.join(differ)}: pass the "
                              f"checkpoint's values")  # fmt: skip
    if bad := non_finite(ckpt["nets"]):
        raise CheckpointError(f"checkpoint {path} holds non-finite weights ({', '.join(bad[:3])}): use an earlier "
                              f"checkpoint (best.pt) or retrain")  # fmt: skip
    return ckpt


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def restore(ckpt: dict, path: str, nets: dict, optimizers: dict | None = None, rng=None) -> None:
    """Load the state dicts of `nets` (name -> module), and of `optimizers` and `rng` when given.

    An optimizer keeps the hyperparameters it was built with (the flags: --resume --learning-rate <lower> lowers it)
    and takes its moments and step counts from the checkpoint."""
    try:
        for name, module in nets.items():
            module.load_state_dict(ckpt["nets"][name])
        for name, opt in (optimizers or {}).items():  # moments from the checkpoint, hyperparameters from the flags
            hyper = [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
            opt.load_state_dict(ckpt["optimizers"][name])
            for group, h in zip(opt.param_groups, hyper, strict=True):
                group.update(h)
        if rng is not None:
            torch.set_rng_state(ckpt["rng"]["torch"])
            rng.bit_generator.state = ckpt["rng"]["numpy"]
    except (RuntimeError, KeyError, ValueError, TypeError) as e:  # another layout, or a tampered entry
        detail = " ".join(str(e).split())[:200]
        raise CheckpointError(f"checkpoint {path} holds other networks or states than this script builds "
                              f"({type(e).__name__}: {detail})") from None  # fmt: skip


def sub_state(state_dict: dict, prefix: str) -> dict:
    """The entries of `state_dict` under `prefix` (e.g. "agents.red."), with the prefix removed: one submodule's."""
    return {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}


def groups_state(state_dict: dict, groups, parts: tuple[str, ...]) -> dict:
    """The entries of `state_dict` that the same network rebuilt for `groups` (some of the groups it was trained on)
    holds: every entry outside the per-group submodules `parts` (ModuleDicts or ParameterDicts keyed by group, e.g.
    ("encoders", "heads")), and the entries of `parts` under one of `groups`."""
    return {k: v for k, v in state_dict.items() if (key := k.split("."))[0] not in parts or key[1] in groups}


def pack(tree):
    """`tree` (nested dicts, lists, tuples of numpy arrays, tensors, numbers, None) in types `torch.load(...,
    weights_only=True)` reads: each numpy array becomes {"ndarray": tensor}. `unpack` inverts it."""
    if isinstance(tree, np.ndarray):
        return {"ndarray": torch.from_numpy(tree.copy())}
    if isinstance(tree, np.generic):
        return tree.item()
    if isinstance(tree, dict):
        return {k: pack(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(pack(v) for v in tree)
    return tree


def unpack(tree, device=None):
    """`pack`'s inverse; tensors go to `device` when given."""
    if isinstance(tree, dict):
        if tree.keys() == {"ndarray"} and torch.is_tensor(tree["ndarray"]):
            return tree["ndarray"].numpy()
        return {k: unpack(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(unpack(v, device) for v in tree)
    return tree.to(device) if device is not None and torch.is_tensor(tree) else tree


def rng_state(rng: np.random.Generator) -> dict:
    return {"torch": torch.get_rng_state(), "numpy": rng.bit_generator.state}
