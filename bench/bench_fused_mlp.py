"""What hand-fused kernels would buy the PPO update (option 2 of issue 22): a measured prototype, not a script's path.

    python bench/bench_fused_mlp.py           # writes results/speed/fused_mlp.md and fused_mlp.json

One PPO minibatch step at JaxMARL's IPPO config (speed/jaxmarl.md: simple_spread_v3, 3 agents, 21 inputs with the
agent id, 64-wide actor and critic of two hidden layers, 5 actions, 1,536 rows a minibatch), two ways, one thread:

* eager torch, as our scripts do it: the networks' forward, the clipped surrogate, entropy and value loss, autograd's
  backward, fused Adam;
* the same step by hand in Numba (`step` below): the forward and backward of each network with the products in
  BLAS (np.dot) and every elementwise pass fused into one loop per layer (bias and ReLU; the ReLU mask and the bias
  gradient), the loss and its gradient in one pass over the rows, Adam in one pass over every parameter.

And the acting forward of a rollout step (48 rows: 16 envs x 3 agents), both networks and the log-softmax, eager
against Numba. Before timing, the prototype's gradients are checked against autograd's on the same batch (the
largest difference is reported), and both sides then take the same Adam steps, so they time the same work.

Then the middle road (option (a) of the issue's notes: the networks as one compiled op, the loss as the script
reads it under torch.compile) on ippo.py's own `update()` at both configs, as it runs with every option of the
script (value normalization and clipping, Huber loss, masks, gradient clipping, minibatch sampling): eager, with its
networks swapped for the prototype's NumbaMLP op, with its loss (`script_loss`, the update's lines gathered in one
function; a test holds it to the script's) compiled, and both.

What it says: the ceiling of option 2 (a second implementation of the networks, tested against torch), as time per
minibatch step and per acting call, beside the products alone. It is not a training path: the scripts keep torch.
"""

import os

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # one thread for the BLAS that
    os.environ.setdefault(_name, "1")  # np.dot calls in Numba (scipy's), set before it loads

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from datetime import date  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from host import cpu_name, out_file, positive  # noqa: E402
from numba import njit  # noqa: E402

from runtime.mlp import _dense  # noqa: E402  x @ w + b, ReLU'd in the same pass: the acting pass's layer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
D_IN, HIDDEN, N_ACTIONS, ROWS, ACT_ROWS = 21, 64, 5, 1536, 48
CLIP, ENT_COEF, VF_COEF, LR, BETAS, EPS = 0.2, 0.01, 0.5, 2.5e-4, (0.9, 0.999), 1e-5


def init_params(rng: np.random.Generator) -> list[np.ndarray]:
    """Actor (W1, b1, W2, b2, W3, b3) then critic, weights (d_in, d_out) float32."""
    params = []
    for d_out in (N_ACTIONS, 1):
        for d_in, d in ((D_IN, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, d_out)):
            params += [(rng.standard_normal((d_in, d)) / np.sqrt(d_in)).astype(np.float32), np.zeros(d, np.float32)]
    return params


def batch(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, ...]:
    """Inputs, actions, old log-probs, advantages, returns."""
    x = rng.standard_normal((rows, D_IN)).astype(np.float32)
    old_logp = (np.log(1 / N_ACTIONS) + 0.1 * rng.standard_normal(rows)).astype(np.float32)
    adv, ret = rng.standard_normal((2, rows)).astype(np.float32)
    return x, rng.integers(0, N_ACTIONS, rows), old_logp, adv, ret


# --- eager torch, as the scripts do it ---


def torch_nets(params: list[np.ndarray]) -> list[torch.nn.Sequential]:
    nets = []
    for k in (0, 6):
        layers = []
        for j in range(3):
            w, b = params[k + 2 * j], params[k + 2 * j + 1]
            lin = torch.nn.Linear(*w.shape)
            lin.weight.data, lin.bias.data = torch.tensor(w.T.copy()), torch.tensor(b)
            layers += [lin, torch.nn.ReLU()] if j < 2 else [lin]
        nets.append(torch.nn.Sequential(*layers))
    return nets


def torch_loss(actor, critic, x, a, old_logp, adv, ret, loss=None):
    return (loss or ppo_loss)(actor(x), critic(x)[:, 0], a, old_logp, adv, ret)


def ppo_loss(logits, value, a, old_logp, adv, ret):
    logp_all = torch.log_softmax(logits, -1)
    ratio = torch.exp(logp_all.gather(1, a[:, None])[:, 0] - old_logp)
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - CLIP, 1 + CLIP) * adv)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return -surrogate.mean() - ENT_COEF * entropy.mean() + 0.5 * VF_COEF * ((value - ret) ** 2).mean()


# --- the same by hand, in Numba ---


@njit(cache=True)
def _forward(x, w1, b1, w2, b2, w3, b3):
    h1 = _dense(x, w1, b1, True)
    h2 = _dense(h1, w2, b2, True)
    return h1, h2, _dense(h2, w3, b3, False)


@njit(cache=True)
def _relu_back(dh, h, db):  # zero dh where the ReLU was off, and sum the bias gradient, in one pass
    db[:] = 0.0
    for i in range(dh.shape[0]):
        for j in range(dh.shape[1]):
            if h[i, j] <= 0.0:
                dh[i, j] = 0.0
            db[j] += dh[i, j]


@njit(cache=True)
def _backward(x, h1, h2, dy, w2, w3, dw1, db1, dw2, db2, dw3, db3):
    dw3[:, :] = np.dot(h2.T, dy)
    db3[:] = dy.sum(axis=0)
    dh = np.dot(dy, w3.T)
    _relu_back(dh, h2, db2)
    dw2[:, :] = np.dot(h1.T, dh)
    dh = np.dot(dh, w2.T)
    _relu_back(dh, h1, db1)
    dw1[:, :] = np.dot(x.T, dh)


@njit(cache=True)
def _loss_grads(logits, value, a, old_logp, adv, ret):  # d loss / d logits, d loss / d value, and the loss
    n, m = logits.shape
    dlogits, dvalue, loss = np.empty_like(logits), np.empty_like(value), 0.0
    logp = np.empty(m, np.float32)
    for i in range(n):
        top = logits[i].max()
        total = 0.0
        for j in range(m):
            total += np.exp(logits[i, j] - top)
        entropy = 0.0
        for j in range(m):
            logp[j] = logits[i, j] - top - np.log(total)
            entropy -= np.exp(logp[j]) * logp[j]
        ratio = np.exp(logp[a[i]] - old_logp[i])
        clipped = min(max(ratio, 1 - CLIP), 1 + CLIP)
        unclipped_wins = ratio * adv[i] <= clipped * adv[i]
        loss += (-min(ratio * adv[i], clipped * adv[i]) - ENT_COEF * entropy) / n
        g = -adv[i] * ratio / n if (unclipped_wins or clipped == ratio) else 0.0  # d loss / d logp[a]
        for j in range(m):
            p = np.exp(logp[j])
            dlogits[i, j] = g * ((1.0 if j == a[i] else 0.0) - p) + ENT_COEF * p * (logp[j] + entropy) / n
        diff = value[i, 0] - ret[i]
        loss += 0.5 * VF_COEF * diff * diff / n
        dvalue[i, 0] = VF_COEF * diff / n
    return dlogits, dvalue, loss


@njit(cache=True)
def _grads(p, g, x, a, old_logp, adv, ret):  # p, g: tuples of the 12 parameters' views and their gradients'
    ah1, ah2, logits = _forward(x, p[0], p[1], p[2], p[3], p[4], p[5])
    ch1, ch2, value = _forward(x, p[6], p[7], p[8], p[9], p[10], p[11])
    dlogits, dvalue, loss = _loss_grads(logits, value, a, old_logp, adv, ret)
    _backward(x, ah1, ah2, dlogits, p[2], p[4], g[0], g[1], g[2], g[3], g[4], g[5])
    _backward(x, ch1, ch2, dvalue, p[8], p[10], g[6], g[7], g[8], g[9], g[10], g[11])
    return loss


@njit(cache=True)
def _adam(flat, flat_grad, m, v, t):  # one pass over every parameter (flat: the buffer the views live in)
    c1, c2 = 1.0 - BETAS[0] ** t, 1.0 - BETAS[1] ** t
    for i in range(flat.size):
        m[i] = BETAS[0] * m[i] + (1 - BETAS[0]) * flat_grad[i]
        v[i] = BETAS[1] * v[i] + (1 - BETAS[1]) * flat_grad[i] * flat_grad[i]
        flat[i] -= LR * (m[i] / c1) / (np.sqrt(v[i] / c2) + EPS)


@njit(cache=True)
def step(p, g, flat, flat_grad, m, v, t, x, a, old_logp, adv, ret):
    """One PPO minibatch step by hand: forward, loss, backward, Adam; returns the loss."""
    loss = _grads(p, g, x, a, old_logp, adv, ret)
    _adam(flat, flat_grad, m, v, t)
    return loss


def views(arrays: list[np.ndarray]) -> tuple[np.ndarray, tuple]:
    """One flat float32 buffer holding copies of `arrays`, and a view of it shaped as each."""
    flat = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float32)
    out, at = [], 0
    for a in arrays:
        out.append(flat[at : at + a.size].reshape(a.shape))
        at += a.size
    return flat, tuple(out)


@njit(cache=True)
def act_forward(p, x):
    """The acting pass: both networks' outputs and the log-softmax of the logits."""
    _, _, logits = _forward(x, p[0], p[1], p[2], p[3], p[4], p[5])
    _, _, value = _forward(x, p[6], p[7], p[8], p[9], p[10], p[11])
    for i in range(logits.shape[0]):
        top = logits[i].max()
        total = np.log(np.exp(logits[i] - top).sum()) + top
        logits[i] -= total
    return logits, value


class NumbaMLP(torch.autograd.Function):
    """The middle road: each network one autograd op whose forward and backward are the Numba kernels above, the
    loss and Adam left to torch (the script would keep its loss as it reads)."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, w3, b3):
        arrays = [t.detach().numpy() for t in (x, w1, b1, w2, b2, w3, b3)]
        h1, h2, y = _forward(*arrays)
        ctx.arrays = arrays[0], h1, h2, arrays[3], arrays[5]
        return torch.from_numpy(y)

    @staticmethod
    def backward(ctx, dy):
        x, h1, h2, w2, w3 = ctx.arrays
        grads = [np.empty((x.shape[1], h1.shape[1]), np.float32), np.empty(h1.shape[1], np.float32),
                 np.empty((h1.shape[1], h2.shape[1]), np.float32), np.empty(h2.shape[1], np.float32),
                 np.empty((h2.shape[1], dy.shape[1]), np.float32), np.empty(dy.shape[1], np.float32)]  # fmt: skip
        _backward(x, h1, h2, np.ascontiguousarray(dy.numpy()), w2, w3, *grads)
        return None, *(torch.from_numpy(g) for g in grads)


def max_grad_diff(params, data) -> dict[str, float]:
    """Both prototypes' gradients against autograd's on the same weights and batch (largest absolute difference)."""
    actor, critic = torch_nets(params)
    tensors = [torch.tensor(d) for d in data]
    torch_loss(actor, critic, *tensors).backward()
    reference = [p.grad.numpy() for net in (actor, critic) for p in net.parameters()]  # weight (out, in), bias
    _, by_hand = views([np.zeros_like(p) for p in params])
    _grads(tuple(params), by_hand, *data)
    weights = [torch.nn.Parameter(torch.tensor(q)) for q in params]
    actor, critic = (lambda x: NumbaMLP.apply(x, *weights[:6])), (lambda x: NumbaMLP.apply(x, *weights[6:]))
    torch_loss(actor, critic, *tensors).backward()
    in_autograd = [w.grad.numpy() for w in weights]
    diff = lambda grads: float(
        max(
            np.abs((g.T if g.ndim == 2 else g) - r).max()  # noqa: E731
            for g, r in zip(grads, reference, strict=True)
        )
    )  # (in, out) vs torch's (out, in)
    return {"Numba step": diff(by_hand), "Numba networks in autograd": diff(in_autograd)}


def ms_per_call(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def measure(repeats: int, inner: int, rows: int = ROWS) -> dict:
    rng = np.random.default_rng(0)
    params, data, acting = init_params(rng), batch(rng, rows), batch(rng, ACT_ROWS)[0]
    diff = max_grad_diff(params, data)
    actor, critic = torch_nets(params)
    opt = torch.optim.Adam([*actor.parameters(), *critic.parameters()], LR, betas=BETAS, eps=EPS, fused=True)
    tensors = [torch.tensor(d) for d in data]

    def eager_step():
        opt.zero_grad(set_to_none=True)
        torch_loss(actor, critic, *tensors).backward()
        opt.step()

    flat, p = views(params)
    flat_grad, g = views([np.zeros_like(q) for q in params])
    m, v, counter = np.zeros_like(flat), np.zeros_like(flat), [0]

    def fused_step():
        counter[0] += 1
        step(p, g, flat, flat_grad, m, v, counter[0], *data)

    weights = [torch.nn.Parameter(torch.tensor(q)) for q in params]  # (in, out), as the kernels take them
    opt_mixed = torch.optim.Adam(weights, LR, betas=BETAS, eps=EPS, fused=True)
    mixed_actor = lambda x: NumbaMLP.apply(x, *weights[:6])  # noqa: E731
    mixed_critic = lambda x: NumbaMLP.apply(x, *weights[6:])  # noqa: E731

    def mixed_step():
        opt_mixed.zero_grad(set_to_none=True)
        torch_loss(mixed_actor, mixed_critic, *tensors).backward()
        opt_mixed.step()

    compiled = torch.compile(ppo_loss, dynamic=False)
    start = time.perf_counter()
    torch_loss(mixed_actor, mixed_critic, *tensors, loss=compiled).backward()
    compile_s = time.perf_counter() - start

    def eager_compiled_loss_step():
        opt.zero_grad(set_to_none=True)
        torch_loss(actor, critic, *tensors, loss=compiled).backward()
        opt.step()

    def compiled_step():
        opt_mixed.zero_grad(set_to_none=True)
        torch_loss(mixed_actor, mixed_critic, *tensors, loss=compiled).backward()
        opt_mixed.step()

    xa = torch.tensor(acting)

    def eager_act():
        with torch.inference_mode():
            torch.log_softmax(actor(xa), -1), critic(xa)

    products = [(rows, D_IN, HIDDEN), (rows, HIDDEN, HIDDEN), (rows, HIDDEN, N_ACTIONS), (rows, HIDDEN, 1)]
    mats = [(torch.randn(r, k), torch.randn(k, c)) for r, k, c in products]

    def products_alone():  # 3 products per layer (forward, input and weight gradients) at the forward's shapes
        for _ in range(3):
            for p, q in mats:
                torch.mm(p, q)
        for p, q in mats[:2]:  # the critic's hidden layers
            for _ in range(3):
                torch.mm(p, q)

    forms = {"eager torch step": eager_step, "Numba step": fused_step,
             "Numba networks in autograd, torch loss and Adam": mixed_step,
             "eager torch networks, torch.compile'd loss, torch Adam": eager_compiled_loss_step,
             "Numba networks in autograd, torch.compile'd loss, torch Adam": compiled_step,
             "eager torch acting": eager_act,
             "Numba acting": lambda: act_forward(p, acting), "products alone (step)": products_alone}  # fmt: skip
    for fn in forms.values():  # compile and warm up
        for _ in range(3):
            fn()
    rows = {name: [] for name in forms}
    for _ in range(repeats):  # the forms interleaved
        for name, fn in forms.items():
            rows[name].append(ms_per_call(fn, inner * (10 if "acting" in name else 1)))
    return dict(max_grad_diff=diff, compile_s=compile_s, ms={name: statistics.median(t) for name, t in rows.items()})


# --- the middle road on the script's own update: ippo.py's update() as it runs, its pieces swapped ---


def script_loss(m, pol, out, new_v, mb, norm, args):
    """ippo.py's loss, its update's lines unchanged but gathered in one function so torch.compile can take it."""
    mask = mb["agent_mask"]
    d = pol.dist(out, mb.get("avail_actions"))
    logprob, entropy = pol.log_prob(d, mb["actions"]), pol.entropy(d)
    logratio = logprob - mb["logprobs"]
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = m.masked_mean(mask, (ratio - 1) - logratio)
        clipfrac = m.masked_mean(mask, ((ratio - 1.0).abs() > args.clip_coef).float())
    adv = mb["advantages"]
    if args.norm_adv:
        mean = m.masked_mean(mask, adv)
        adv = (adv - mean) / (m.masked_mean(mask, (adv - mean) ** 2).sqrt() + 1e-8)
    clipped_ratio = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = m.masked_mean(mask, torch.max(-adv * ratio, -adv * clipped_ratio))
    target, old_v = norm(mb["returns"]), norm(mb["values"])
    err = (target - new_v).abs()
    if args.clip_vloss:
        err = torch.max(err, (target - old_v - (new_v - old_v).clamp(-args.clip_coef, args.clip_coef)).abs())
    h = args.huber_delta
    v_loss = m.masked_mean(mask, torch.where(err < h, 0.5 * err**2, h * (err - 0.5 * h)) if h > 0 else 0.5 * err**2)
    ent = m.masked_mean(mask, entropy)
    return pg_loss - args.ent_coef * ent + args.vf_coef * v_loss, pg_loss, v_loss, ent, approx_kl, clipfrac


def script_update(m, pol, opt, rb, args, rng, loss_fn):
    """ippo.py's update() (feed-forward) with its loss from `loss_fn`; returns its policy and value losses."""
    norm = pol.value_norm.normalize if args.value_norm else (lambda x: x)
    for _ in range(args.update_epochs):
        for mb in rb.minibatches(args.num_minibatches, rng):
            mb = m.to_torch(mb, "cpu")
            out, new_v = m.forward_batch(pol, mb, args)
            loss, pg_loss, v_loss, _, _, clipfrac = loss_fn(m, pol, out, new_v, mb, norm, args)
            clipfrac.item()
            if not torch.isfinite(loss):
                raise FloatingPointError(loss.item())
            opt.zero_grad()
            loss.backward()
            m.clip_grad_norm(pol.actor.parameters(), args.max_grad_norm)
            m.clip_grad_norm(pol.critic.parameters(), args.max_grad_norm)
            opt.step()
    return pg_loss.item(), v_loss.item()


def numba_net_forward(net, x, hx=None, keep=None):
    """A shared `Net`'s forward as one NumbaMLP op (inputs already normalized, ids appended), in place of its own."""
    w = [t for layer in (net.fc, net.mid, net.head) for t in (layer.weight[0], layer.bias[0, 0])]
    return NumbaMLP.apply(x.reshape(-1, x.shape[-1]), *w).view(*x.shape[:-1], -1), None


def script_losses(m, pol, opt, rb, args) -> list[tuple[float, float]]:
    """The policy and value losses of one update from the same weights, by ippo.py's update() and by script_update
    with `script_loss`: equal while script_loss is the script's loss (checked before timing, and by a test)."""
    start, losses = {k: v.clone() for k, v in pol.state_dict().items()}, []
    for fn in (lambda: m.update(pol, opt, rb, args, "cpu", np.random.default_rng(5)),
               lambda: script_update(m, pol, opt, rb, args, np.random.default_rng(5), script_loss)):  # fmt: skip
        pol.load_state_dict(start)
        opt.state.clear()
        r = fn()
        losses.append((r["policy_loss"], r["value_loss"]) if isinstance(r, dict) else r)
    return losses


def measure_script_update(repeats: int, **flags) -> dict:
    """ippo.py's update, eager and with the middle road's pieces, on one filled rollout; the forms interleaved."""
    from bench_update import filled_rollout, load_script  # noqa: PLC0415

    m = load_script("ippo")
    sys.modules.setdefault(m.__name__, m)  # torch.compile imports the module of the functions it traces
    plain = m.Net.forward
    args, pol, opt, rb, rng = filled_rollout("ippo", m, **flags)
    losses = script_losses(m, pol, opt, rb, args)
    assert np.allclose(*losses, rtol=1e-5), f"script_loss differs from ippo.py's loss: {losses}"
    compiled = torch.compile(script_loss, dynamic=False)
    t0 = time.perf_counter()
    script_update(m, pol, opt, rb, args, rng, compiled)
    compile_s = time.perf_counter() - t0

    def with_net(forward, fn):
        def run():
            m.Net.forward = forward
            try:
                fn()
            finally:
                m.Net.forward = plain

        return run

    update = lambda: m.update(pol, opt, rb, args, "cpu", rng)  # noqa: E731
    compiled_update = lambda: script_update(m, pol, opt, rb, args, rng, compiled)  # noqa: E731
    forms = {"ippo.py's update, eager": update,
             "its networks as one Numba op each": with_net(numba_net_forward, update),
             "its loss torch.compile'd": compiled_update,
             "both": with_net(numba_net_forward, compiled_update)}  # fmt: skip
    for fn in forms.values():
        fn()
    times = {name: [] for name in forms}
    for _ in range(repeats):
        for name, fn in forms.items():
            times[name].append(ms_per_call(fn, 1))
    return dict(compile_s=compile_s, ms={name: statistics.median(t) for name, t in times.items()})


SHAPES = {  # name -> (rows of a minibatch, minibatch steps per update)
    "JaxMARL's IPPO config": (ROWS, 16),  # 16 envs x 128 steps x 3 agents in 4 minibatches, 4 epochs
    "our defaults' size": (9600, 10),  # 128 envs x 25 steps x 3 agents in 1 minibatch, 10 epochs
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive(int), default=7)
    parser.add_argument("--inner", type=positive(int), default=50,
                        help="steps per timing at 1,536 rows (fewer for more rows; acting: 10x as many)")  # fmt: skip
    parser.add_argument("--out", type=out_file, default=OUT / "fused_mlp")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load = os.getloadavg()
    results = {name: measure(args.repeats, max(5, args.inner * ROWS // rows), rows)
               for name, (rows, _) in SHAPES.items()}  # fmt: skip
    first = results[next(iter(SHAPES))]
    from bench_update import MATCHED  # noqa: PLC0415

    real = {"JaxMARL's IPPO config": measure_script_update(args.repeats, **MATCHED),
            "our defaults": measure_script_update(args.repeats)}  # fmt: skip
    lines = [
        "# Hand-fused kernels for the PPO update: the measured ceiling of issue 22's option 2 (a prototype)",
        "",
        f"Measured {date.today()} on {cpu_name()}, torch {torch.__version__}, one thread, load average "
        f"{', '.join(f'{x:.1f}' for x in load)} before. Regenerate: `python bench/bench_fused_mlp.py` (what it "
        f"times: its docstring). Median of {args.repeats} timings, the forms interleaved. One PPO minibatch step of "
        "IPPO's two 64-wide networks on simple_spread_v3, at two minibatch sizes.",
        "",
        "The prototypes' gradients against autograd's on the same batch, largest difference: "
        + ", ".join(f"{k} {v:.1e}" for k, v in first["max_grad_diff"].items())
        + f". The loss's compilation (torch.compile of `ppo_loss`, its first call, forward and backward): "
        f"{first['compile_s']:.1f} s (torch's on-disk cache may hold it from an earlier run).",
        "",
    ]
    head, rule = "| form |", "|---|"
    for name, (rows, steps) in SHAPES.items():
        head += f" {name}: {rows:,} rows, ms | / eager | / products | ms per update ({steps} steps) |"
        rule += "---:|---:|---:|---:|"
    lines += [head, rule]
    for form in first["ms"]:
        if "acting" in form:
            continue
        row = f"| {form} |"
        for name, (_, steps) in SHAPES.items():
            ms = results[name]["ms"]
            value, eager, products = ms[form], ms["eager torch step"], ms["products alone (step)"]
            row += f" {value:.3f} | {value / eager:.2f}x | {value / products:.2f}x | {value * steps:.1f} |"
        lines.append(row)
    eager, numba = first["ms"]["eager torch acting"], first["ms"]["Numba acting"]
    lines += ["", f"Acting, one rollout step of {ACT_ROWS} rows (16 envs x 3 agents; both networks and the "
              f"log-softmax, no sampling): eager torch {eager * 1e3:.0f} us, Numba {numba * 1e3:.0f} us "
              f"({numba / eager:.2f}x); per rollout of 128 steps {eager * 128:.1f} ms against "
              f"{numba * 128:.1f} ms."]  # fmt: skip
    lines += ["", "## The middle road on the script's own update", "",
              "ippo.py's `update()` as it runs (one filled rollout of simple_spread_v3 on the Numba MPE, the script's "
              "optimizer, every option at its value), timed whole, with the prototype's pieces swapped in: its "
              "networks' forward as one NumbaMLP op each (the prototype's kernels; inputs normalized and ids appended "
              "by the script as before), its loss (the update's lines gathered in one function, `script_loss`, checked "
              "to give the script's losses) under torch.compile, and both. Median of "
              f"{args.repeats} updates, the forms interleaved.", "",
              "| form | " + " | ".join(f"{name}: ms | / eager" for name in real) + " |",
              "|---|" + "---:|---:|" * len(real)]  # fmt: skip
    for form in next(iter(real.values()))["ms"]:
        cells = [(r["ms"][form], r["ms"][form] / r["ms"]["ippo.py's update, eager"]) for r in real.values()]
        lines.append(f"| {form} | " + " | ".join(f"{ms:.1f} | {ratio:.2f}x" for ms, ratio in cells) + " |")
    lines += ["", "The loss's compilation, first update: " + ", ".join(
        f"{name} {r['compile_s']:.1f} s" for name, r in real.items()) + "."]  # fmt: skip
    results["script_update"] = real
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(dict(results, load=load, cpu=cpu_name()), indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
