"""BBKB's in-batch selection with one host read per ``check_every`` picks: the loop for a GPU.

:func:`~torchbkb.bandits.batch_selection.select_batch` refreshes only the arms that can still win (lazy UCB) and reads
each pick on the host to decide which: the fewest flops, and on a GPU a host synchronization or several per pick
(``docs/gpu.md``). Here every pick refreshes every
arm -- ``O(A·r)`` flops, a few kernel launches, no host read -- and the stop rule is kept on the device as a done
flag: picks after it are computed and dropped, and the host reads the flag once per ``check_every`` picks and the
picks once per batch. Same rule and picks as ``select_batch(..., lazy=False)``::

    σ̃²_t(a) = σ̃²_{t-1}(a) - c_t (z(a)ᵀ u_t)²,   u_t = V_{t-1}⁻¹ z(x_t),   c_t = 1 / (1 + z(x_t)ᵀ u_t)

with the batch's last pick not hallucinated. The stop level ``1 + Σ σ̃²_fb(x_s)`` and a repeated arm's
hallucinations are summed pick by pick here and run by run there, so a batch can end one pick apart only where the
level meets ``C̃`` within rounding.

Example:
    >>> import torch
    >>> from torchbkb.bandits.batch_selection import select_batch
    >>> Z = torch.eye(3, dtype=torch.float64)
    >>> mean = torch.tensor([0.0, 0.1, 0.2], dtype=torch.float64)
    >>> rls, V_inv = torch.ones(3, dtype=torch.float64), torch.eye(3, dtype=torch.float64)
    >>> sel = select_batch_on_device(Z, mean, rls, V_inv, alpha=1.0, batch_bound=2.5)
    >>> sel.indices.tolist() == select_batch(Z, mean, rls, V_inv, alpha=1.0, batch_bound=2.5).indices.tolist()
    True
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from torchbkb.bandits.batch_selection import BatchSelection
from torchbkb.bandits.batch_stop_rule import UNBOUNDED_PICKS, check_batch_limits

__all__ = ["select_batch_on_device", "run_batch_on_device", "pick_step", "PickState", "use_device_loop", "CHECK_EVERY",
           "DEVICE_PICKS_MAX"]

#: Picks between two host reads of the done flag.
CHECK_EVERY = 32
#: Picks after which :class:`~torchbkb.BBKB` gives a batch to the lazy loop: a long batch is mostly runs of one arm,
#: which the lazy loop takes in closed form and this loop pick by pick, every arm each time.
DEVICE_PICKS_MAX = 4096


class PickState(NamedTuple):
    """The device-side state of a batch between two picks (0-d tensors and the running arrays)."""

    cur: torch.Tensor  #: `(A,)` σ̃²_t of every arm
    ucb: torch.Tensor  #: `(A,)` μ̃_fb + α̃ σ̃_t
    V_inv: torch.Tensor  #: `(r, r)` V_t⁻¹, every pick but the batch's last hallucinated
    level: torch.Tensor  #: 1 + Σ σ̃²_fb of the picks so far
    done: torch.Tensor  #: the batch has ended
    count: torch.Tensor  #: picks up to and including the batch's last


def pick_step(Z: torch.Tensor, mean: torch.Tensor, rls0: torch.Tensor, state: PickState, alpha: float, C: float,
              stall_check: bool, at_cap: bool) -> tuple[torch.Tensor, torch.Tensor, PickState]:
    """One pick with no host read (it compiles with ``torch.compile(fullgraph=True)``): the argmax arm ``i``, its
    ``σ̃²_t`` when picked, and the state after hallucinating it (unless it ends the batch, or the batch had ended).

    Args:
        Z: `(A, r)`; mean, rls0: `(A,)` in ``Z``'s dtype; state: :class:`PickState`; alpha: ``α̃``; C: ``C̃``;
        stall_check: no cap (a stalled stop rule ends the batch); at_cap: this pick is the cap's (a Python bool).
    """
    work, dt = state.V_inv.dtype, Z.dtype
    # (1,) on the device, lowest index among ties; read with index_select: x[i] with a 0-d tensor reads i on the host
    i = torch.argmax(state.ucb).reshape(1)
    z = Z.index_select(0, i)[0].to(work)  # (r,)
    u = state.V_inv @ z
    s = z @ u
    s0 = rls0.index_select(0, i)[0].to(work)
    stalls = s0 <= 0  # a zero variance, or (without a cap) a rule that would need over UNBOUNDED_PICKS picks
    if stall_check:
        stalls = stalls | ((C - state.level) >= UNBOUNDED_PICKS * s0.clamp_min(0.0))
    level = torch.where(state.done, state.level, state.level + s0)
    live = ~state.done
    last = live if at_cap else live & ((level > C) | stalls)  # at_cap, a Python bool: no kernel of its own
    ended = state.done | last
    g = torch.where(ended, 0.0, 1.0 / (1.0 + s))  # the last pick is not hallucinated
    V_t = state.V_inv - g * torch.outer(u, u)
    w = Z @ u.to(dt)  # (A,)
    cur = (state.cur - g.to(dt) * w * w).clamp_min(0.0)
    ucb = mean + alpha * cur.sqrt()
    count = state.count + live  # long + bool: the count of live picks
    return i[0], state.cur.index_select(0, i)[0], PickState(cur, ucb, V_t, level, ended, count)


def use_device_loop(device: torch.device) -> bool:
    """Whether :class:`~torchbkb.BBKB` selects its batches on ``device`` with this loop: on every device but the
    CPU, where the lazy loop's fewer flops win and a host read costs nothing."""
    return torch.device(device).type != "cpu"


def select_batch_on_device(
    Z: torch.Tensor,
    mean: torch.Tensor,
    rls: torch.Tensor,
    V_inv: torch.Tensor,
    alpha: float,
    batch_bound: float,
    max_batch_size: int | None = None,
    *,
    check_every: int = CHECK_EVERY,
) -> BatchSelection:
    """One BBKB batch (the ``"sum"`` stop rule) with no host read inside a pick (see :func:`run_batch_on_device`)."""
    return run_batch_on_device(Z, mean, rls, V_inv, alpha, batch_bound, max_batch_size, check_every=check_every)[0]


def run_batch_on_device(
    Z: torch.Tensor,
    mean: torch.Tensor,
    rls: torch.Tensor,
    V_inv: torch.Tensor,
    alpha: float,
    batch_bound: float,
    max_batch_size: int | None = None,
    *,
    check_every: int = CHECK_EVERY,
    first_check: int | None = None,
    pick_limit: int | None = None,
    graphs=None,
    extra: tuple[torch.Tensor, list] | None = None,
) -> tuple[BatchSelection, list[int]] | None:
    """One BBKB batch (the ``"sum"`` stop rule) with no host read inside a pick, and its picks on the host: the done
    flag, the count and the picks so far are read together, once per ``check_every`` picks.

    Args:
        Z: `(A, r)` embedded candidates (a tensor; the UCBs are computed in its dtype).
        mean: `(A,)` frozen mean ``μ̃_fb``; ``-inf`` excludes an arm.
        rls: `(A,)` RLS-scale variances ``σ̃²_fb`` at the batch start.
        V_inv: `(r, r)` ``V_fb⁻¹`` (not modified; the updates run in its dtype).
        alpha: the multiplier ``α̃`` of ``σ̃`` in the UCB.
        batch_bound: ``C̃ >= 1``.
        max_batch_size: optional cap on the batch length.
        check_every: picks between two host reads of the done flag.
        first_check: picks before the first read (default ``check_every``): a batch that ends before it is read
            once; the picks computed past its end are dropped.
        pick_limit: give up (return ``None``) when the batch has not ended after this many picks.
        graphs: a :class:`~torchbkb.bandits.pick_graph.PickGraphs`: on its devices (CUDA) and with no cap, the
            picks are replayed ``check_every`` at a time from a CUDA graph (the same steps on padded features).
        extra: ``(tensor, out)``: a float64 `(k,)` tensor read with the first read, its values appended to ``out``
            (a caller's own flags: one read for both).

    Returns:
        ``(selection, ids)``: a :class:`~torchbkb.bandits.batch_selection.BatchSelection` (``ucb_evaluations``
        counts every arm of every pick) and its indices as Python ints; ``None`` past ``pick_limit``.
    """
    C, cap = check_batch_limits(batch_bound, max_batch_size)
    A = Z.shape[0]
    dt, work, dev = Z.dtype, V_inv.dtype, Z.device
    alpha = float(alpha)
    mean_c, rls0 = mean.to(dt), rls.to(dt)
    limit = UNBOUNDED_PICKS if cap is None else cap
    graph = None
    if graphs is not None and cap is None:
        graph = graphs.get(A, Z.shape[1], dt, work, dev, check_every)
    if graph is not None:  # replays of check_every picks, the first read after whole replays
        graph.load(Z, mean_c, rls0, V_inv, alpha, C)
        per = graph.picks

        def advance(k: int, t: int) -> tuple[torch.Tensor, torch.Tensor, PickState]:
            out = [graph.replay() for _ in range(-(-k // per))]
            return torch.cat([i for i, _ in out]), torch.cat([s for _, s in out]), graph.state
    else:
        state = PickState(
            cur=rls0.clone(),
            ucb=mean_c + alpha * rls0.clamp_min(0.0).sqrt(),
            V_inv=V_inv.clone(),
            level=torch.ones((), dtype=work, device=dev),
            done=torch.zeros((), dtype=torch.bool, device=dev),
            count=torch.zeros((), dtype=torch.long, device=dev),
        )

        def advance(k: int, t: int) -> tuple[torch.Tensor, torch.Tensor, PickState]:
            nonlocal state
            ids, rls_in = [], []
            for j in range(k):
                i, rls_i, state = pick_step(Z, mean_c, rls0, state, alpha, C, cap is None, t + j + 1 >= limit)
                ids.append(i)
                rls_in.append(rls_i)
            return torch.stack(ids), torch.stack(rls_in), state

    picks, in_batch, ids = [], [], []
    size = check_every if first_check is None else max(int(first_check), 1)
    t = n = 0
    while t < limit:
        chunk, rls_in, last = advance(min(size, limit - t), t)
        t += chunk.numel()
        picks.append(chunk)
        in_batch.append(rls_in)
        read = torch.cat([torch.stack([last.done.long(), last.count]), chunk])
        if extra is None:
            read = read.tolist()  # the one host read per check_every picks (or per the first ones)
        else:  # the caller's flags in the same read
            flags, out = extra
            both = torch.cat([flags.to(torch.float64), read.to(torch.float64)]).tolist()
            out += both[: flags.numel()]
            read, extra = [int(v) for v in both[flags.numel():]], None
        ids += read[2:]
        n = read[1]
        if read[0]:
            break
        if pick_limit is not None and t >= pick_limit:
            return None
        size = check_every
    idx = torch.cat(picks)[:n]
    r = Z.shape[1]
    selection = BatchSelection(
        indices=idx,
        rls_start=rls0[idx].to(rls.dtype),
        rls_in_batch=torch.cat(in_batch)[:n].to(rls.dtype),
        ucb_evaluations=A * n,
        V_inv=last.V_inv[:r, :r].clone() if graph is not None else last.V_inv,
    )
    return selection, ids[:n]
