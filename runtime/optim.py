"""Optimizers and their steps: Adam fused where torch has it, gradient clipping in foreach ops, the NaN guard of every
script (a loss refused when it is not finite), the off-policy actor-critics' guarded step (the guard, then each
agent's network clipped on its own), and Polyak-averaged target networks.

    optimizer = adam(policy.parameters(), args.learning_rate, eps=1e-5)
    check_finite(loss, f"group {g}: the loss", "lower --learning-rate", policy=pg_loss, value=v_loss)
    clip_grad_norm(policy.actor.parameters(), args.max_grad_norm)
    optimize(critic_loss, optimizers["critic"], critics.values(), args.max_grad_norm, "critic")
    soft_update((actor_targets, critic_targets), (actors, critics), args.tau)

The networks here stack n agents' weights on each parameter's first dimension (one `GroupLinear` per layer), so
one optimizer serves them all; clipping each agent's slice to `max_grad_norm` is what n separate optimizers with
`clip_grad_norm_` would do (the MADDPG authors' code), in a few foreach ops.
"""

import sys

import torch
import torch.nn as nn

# fused Adam: one kernel for all parameters (on the CPU since torch 2.4); against the per-tensor loop:
# results/speed/update_parts.md
FUSED_ADAM = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 4)
_told = False  # the notice that fused Adam is missing, once per process


def adam(params, lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """torch.optim.Adam, fused where torch can (the same update, in one kernel); elsewhere the foreach form, once
    with a notice (the numbers are equal either way, only the speed differs)."""
    global _told
    params = list(params)
    fused = FUSED_ADAM or all(p.is_cuda for p in params)
    if not fused and not _told:
        print(f"notice: torch {torch.__version__} has no fused Adam on the CPU (2.4 has): using the foreach form",
              file=sys.stderr)  # fmt: skip
        _told = True
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=fused or None, foreach=None if fused else True)


def clip_grad_norm(params, max_norm: float) -> torch.Tensor:
    """nn.utils.clip_grad_norm_ (the gradients scaled so that their joint L2 norm is at most `max_norm`) in three
    foreach ops instead of two per parameter (torch takes that loop on the CPU); returns the norm before."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def check_finite(loss: torch.Tensor, name: str, advice: str, **terms: torch.Tensor) -> None:
    """The NaN guard, called before the optimizer steps: a `loss` that is not finite raises FloatingPointError.

    A non-finite loss poisons every weight it reaches, so the run stops instead, with its last checkpoint intact
    (runtime/run.py). The message names the loss (`name`, e.g. "the TD loss"), its `terms` (name=tensor) and the
    `advice` (the flags to turn): "the TD loss became nan (qmix 0.5, central nan); lower --learning-rate".
    """
    if not torch.isfinite(loss):
        parts = ", ".join(f"{k} {v.item():.3g}" for k, v in terms.items())
        raise FloatingPointError(f"{name} became {loss.item()}{f' ({parts})' if parts else ''}; {advice}")


def optimize(loss, optimizer, nets=(), max_grad_norm: float = 0.0, name: str = "loss") -> None:
    """One step on `loss`, refused if it is not finite (`check_finite`, naming `--{name}-lr`); each agent of each
    stacked network clipped separately."""
    check_finite(loss, f"the {name} loss", f"lower --{name}-lr or check the rewards")
    optimizer.zero_grad()
    loss.backward()
    for net in nets if max_grad_norm > 0 else ():
        grads = [p.grad for p in net.parameters()]  # every parameter stacks the n networks on its first dim
        norms = torch.stack([grad.flatten(1).square().sum(1) for grad in grads]).sum(0).sqrt()  # (n,)
        scale = (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_(grads, [scale.view(-1, *(1,) * (grad.dim() - 1)) for grad in grads])
    optimizer.step()


def soft_update(targets, sources, tau: float) -> None:
    """theta' <- theta' + tau (theta - theta') for every parameter, in one foreach op; every buffer copied.

    `targets` and `sources`: a module, or a sequence of modules, in the same order. Buffers are statistics or
    constants, not weights to average: the copy keeps a target's twin of its source's (--standardise-rewards'
    `reward_norm` in the value-based scripts) current in last.pt, where only the source's is ever read.
    """
    modules = lambda nets: [nets] if isinstance(nets, nn.Module) else nets  # noqa: E731
    params = lambda nets: [p for net in modules(nets) for p in net.parameters()]  # noqa: E731
    buffers = lambda nets: [b for net in modules(nets) for b in net.buffers()]  # noqa: E731
    with torch.no_grad():
        torch._foreach_lerp_(params(targets), params(sources), tau)
        for target, source in zip(buffers(targets), buffers(sources), strict=True):
            target.copy_(source)
