"""BBKB's in-batch selection with one host read per ``check_every`` picks: the loop for a GPU.

:func:`~torchbkb.bandits.batch_selection.select_batch` refreshes only the arms that can still win (lazy UCB) and reads
each pick on the host to decide which: the fewest flops, and on a GPU a host synchronization or several per pick
(``docs/gpu.md``). Here every pick refreshes every arm -- ``O(A·r)`` flops, a few kernel launches, no host read
(:func:`hallucinated_pick`) -- and the host ends the batch from what it reads once per ``check_every`` picks: the
arms and their ``σ̃²_fb``, to which it applies the stop rule in the device's arithmetic
(:func:`~torchbkb.bandits.batch_stop_rule.sum_rule_end`). Every pick is hallucinated; the picks past the batch's
end are dropped, and its final ``V⁻¹`` sums the rank-one terms of all its picks but the last. Same rule and picks
as ``select_batch(..., lazy=False)``::

    σ̃²_t(a) = σ̃²_{t-1}(a) - c_t (z(a)ᵀ u_t)²,   u_t = V_{t-1}⁻¹ z(x_t),   c_t = 1 / (1 + z(x_t)ᵀ u_t)

The stop level ``1 + Σ σ̃²_fb(x_s)`` and a repeated arm's hallucinations are summed pick by pick here and run by
run there, so a batch can end one pick apart only where the level meets ``C̃`` within rounding. The picks run
eagerly or replayed from a CUDA graph (:mod:`~torchbkb.bandits.pick_graph`). :func:`pick_step` keeps the rule on
the device as a done flag (``rule_on_host=False``, and a ``V⁻¹`` in a dtype the host cannot repeat): about 30
kernels a pick against :func:`hallucinated_pick`'s 18.

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
from torchbkb.bandits.batch_stop_rule import HOST_RULE_DTYPES, UNBOUNDED_PICKS, check_batch_limits, sum_rule_end

__all__ = ["select_batch_on_device", "run_batch_on_device", "pick_step", "hallucinated_pick", "hallucinated_picks",
           "PickState", "Replay", "use_device_loop", "CHECK_EVERY", "DEVICE_PICKS_MAX"]

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
    work = state.V_inv.dtype
    # (1,) on the device, lowest index among ties; read with index_select: x[i] with a 0-d tensor reads i on the host
    i = torch.argmax(state.ucb).reshape(1)
    u, s = _solve(Z, state.V_inv, i)
    s0 = rls0.index_select(0, i)[0].to(work)
    raised = state.level + s0
    if stall_check:  # so tiny a variance that the level cannot pass C within 2²⁴ picks, or does not move at all
        stalls = ((C - state.level) >= UNBOUNDED_PICKS * s0.clamp_min(0.0)) | (raised <= state.level)
    else:  # a zero variance, which could never end the batch
        stalls = s0 <= 0
    level = torch.where(state.done, state.level, raised)
    live = ~state.done
    ended = state.done | (live if at_cap else (level > C) | stalls)  # at_cap, a Python bool: no kernel of its own
    g = torch.reciprocal(1.0 + s).masked_fill(ended, 0.0)  # the last pick is not hallucinated
    cur, ucb, V_t = _hallucinate(Z, mean, alpha, state, u, g)
    count = state.count + live  # long + bool: the count of live picks
    return i[0], state.cur.index_select(0, i)[0], PickState(cur, ucb, V_t, level, ended, count)


def hallucinated_pick(Z: torch.Tensor, mean: torch.Tensor, state: PickState, alpha: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, PickState]:
    """:func:`pick_step` with every pick hallucinated and no stop rule (about half its kernels): the picks up to a
    batch's end are the same; its reader ends the batch from the picks' ``σ̃²_fb``
    (:func:`~torchbkb.bandits.batch_stop_rule.sum_rule_end`) and forms the ``V⁻¹`` at the end from ``u``, ``g``.

    Returns:
        ``(i, σ̃²_t(i), u, g, state)``: the arm, its variance when picked, ``u_t = V_{t-1}⁻¹ z(i)`` `(r,)`,
        ``c_t = 1 / (1 + z(i)ᵀ u_t)`` (0-d), and the state with ``cur``, ``ucb``, ``V_inv`` moved (the others as
        they were).
    """
    i = torch.argmax(state.ucb).reshape(1)
    u, s = _solve(Z, state.V_inv, i)
    g = torch.reciprocal(1.0 + s)
    cur, ucb, V_t = _hallucinate(Z, mean, alpha, state, u, g)
    return i[0], state.cur.index_select(0, i)[0], u, g, PickState(cur, ucb, V_t, state.level, state.done, state.count)


def hallucinated_picks(Z: torch.Tensor, mean: torch.Tensor, state: PickState, alpha, k: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, PickState]:
    """``k`` picks of :func:`hallucinated_pick`: their arms `(k,)`, their ``σ̃²`` when picked `(k,)`, their ``u``
    `(k, r)` and ``g`` `(k,)`, and the state after them."""
    ids, rls_in, us, gs = [], [], [], []
    for _ in range(k):
        i, s_i, u, g, state = hallucinated_pick(Z, mean, state, alpha)
        ids.append(i)
        rls_in.append(s_i)
        us.append(u)
        gs.append(g)
    return torch.stack(ids), torch.stack(rls_in), torch.stack(us), torch.stack(gs), state


class Replay(NamedTuple):
    """A chunk of hallucinated picks, as the host's reader takes it."""

    ids: torch.Tensor  #: `(picks,)` the arms, in order
    rls_in: torch.Tensor  #: `(picks,)` their ``σ̃²_t`` when picked
    u: torch.Tensor  #: `(picks, r')` ``u_t = V_{t-1}⁻¹ z(x_t)`` in ``V⁻¹``'s dtype (``r' >= r``: zero past ``r``)
    g: torch.Tensor  #: `(picks,)` ``c_t = 1 / (1 + z(x_t)ᵀ u_t)``
    read: torch.Tensor  #: `(2 picks,)` float64: the arms, then their ``σ̃²_fb`` (the host's one read)

    @classmethod
    def of(cls, ids: torch.Tensor, rls_in: torch.Tensor, u: torch.Tensor, g: torch.Tensor,
           rls0: torch.Tensor) -> Replay:
        """The chunk of :func:`hallucinated_picks`' outputs, its :attr:`read` formed from the batch-start
        variances ``rls0`` `(A,)`."""
        return cls(ids, rls_in, u, g, torch.cat([ids.to(torch.float64), rls0.index_select(0, ids).to(torch.float64)]))


def _solve(Z: torch.Tensor, V_inv: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``u = V⁻¹ z(i)`` and ``s = z(i)ᵀ u`` in ``V⁻¹``'s dtype."""
    z = Z.index_select(0, i)[0].to(V_inv.dtype)  # (r,)
    u = V_inv @ z
    return u, z @ u


def _hallucinate(Z: torch.Tensor, mean: torch.Tensor, alpha, state: PickState, u: torch.Tensor, g: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rank-one step with weight ``g``: ``σ̃²_t``, the UCBs and ``V_t⁻¹``."""
    dt = Z.dtype
    V_t = state.V_inv - g * torch.outer(u, u)
    w = Z @ u.to(dt)  # (A,)
    cur = (state.cur - g.to(dt) * w * w).clamp_min(0.0)
    return cur, mean + alpha * cur.sqrt(), V_t


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
    rule_on_host: bool = True,
) -> tuple[BatchSelection, list[int]] | None:
    """One BBKB batch (the ``"sum"`` stop rule) with no host read inside a pick, and its picks on the host: the
    picks so far (and what the stop rule needs of them) are read together, once per ``check_every`` picks.

    Args:
        Z: `(A, r)` embedded candidates (a tensor; the UCBs are computed in its dtype).
        mean: `(A,)` frozen mean ``μ̃_fb``; ``-inf`` excludes an arm.
        rls: `(A,)` RLS-scale variances ``σ̃²_fb`` at the batch start.
        V_inv: `(r, r)` ``V_fb⁻¹`` (not modified; the updates run in its dtype).
        alpha: the multiplier ``α̃`` of ``σ̃`` in the UCB.
        batch_bound: ``C̃ >= 1``.
        max_batch_size: optional cap on the batch length.
        check_every: picks between two host reads.
        first_check: picks before the first read (default ``check_every``): a batch that ends before it is read
            once; the picks computed past its end are dropped.
        pick_limit: give up (return ``None``) when the batch has not ended after this many picks.
        graphs: a :class:`~torchbkb.bandits.pick_graph.PickGraphs`: on its devices (CUDA), with no cap, the picks
            are replayed ``check_every`` at a time from a CUDA graph (the same picks on padded features).
        extra: ``(tensor, out)``: a float64 `(k,)` tensor read with the first read, its values appended to ``out``
            (a caller's own flags: one read for both).
        rule_on_host: the host ends the batch (:func:`hallucinated_pick`); ``False`` keeps the rule on the device
            as a done flag (:func:`pick_step`: the same batch, more kernels), as a ``V⁻¹`` in a dtype other than
            float32 and float64 does.

    Returns:
        ``(selection, ids)``: a :class:`~torchbkb.bandits.batch_selection.BatchSelection` (``ucb_evaluations``
        counts every arm of every pick) and its indices as Python ints; ``None`` past ``pick_limit``.
    """
    C, cap = check_batch_limits(batch_bound, max_batch_size)
    dt, work = Z.dtype, V_inv.dtype
    alpha = float(alpha)
    mean_c, rls0 = mean.to(dt), rls.to(dt)
    size = check_every if first_check is None else max(int(first_check), 1)
    if not (rule_on_host and work in HOST_RULE_DTYPES):
        return _flagged_batch(Z, mean_c, rls0, V_inv, alpha, C, cap, rls.dtype, size, check_every, pick_limit,
                              extra)
    graph = None
    if graphs is not None and cap is None:
        graph = graphs.get(Z.shape[0], Z.shape[1], dt, work, Z.device, check_every)
    if graph is not None:
        graph.load(Z, mean_c, rls0, V_inv, alpha, C)
        chunks = lambda k: [graph.replay() for _ in range(-(-k // graph.picks))]  # noqa: E731
    else:
        chunks = _eager_chunks(Z, mean_c, rls0, V_inv, alpha)
    return _host_ruled_batch(chunks, Z, rls0, V_inv, C, cap, rls.dtype, size, check_every, pick_limit, extra)


def _start_state(mean_c, rls0, V_inv, alpha) -> PickState:
    """The state before a batch's first pick (level 1, not done, no pick counted)."""
    dev, work = rls0.device, V_inv.dtype
    return PickState(cur=rls0.clone(), ucb=mean_c + alpha * rls0.clamp_min(0.0).sqrt(), V_inv=V_inv.clone(),
                     level=torch.ones((), dtype=work, device=dev), done=torch.zeros((), dtype=torch.bool, device=dev),
                     count=torch.zeros((), dtype=torch.long, device=dev))


def _eager_chunks(Z, mean_c, rls0, V_inv, alpha):
    """``k -> [Replay]``: the next ``k`` hallucinated picks, run eagerly from the batch's start (its level, done
    flag and count unused: the host keeps the rule)."""
    state = _start_state(mean_c, rls0, V_inv, alpha)

    def chunk(k: int) -> list[Replay]:
        nonlocal state
        *out, state = hallucinated_picks(Z, mean_c, state, alpha, k)
        return [Replay.of(*out, rls0)]

    return chunk


def _host_ruled_batch(chunks, Z, rls0, V_inv, C, cap, out_dtype, size, check_every, pick_limit, extra):
    """:func:`run_batch_on_device`'s batch from chunks of hallucinated picks (``chunks(k)``: at least ``k`` more,
    as :class:`Replay` s): the host reads each round's arms and ``σ̃²_fb`` and ends the batch there (the done
    flag's rule, repeated; the cap's pick ends it too), and the final ``V⁻¹`` is
    ``V_fb⁻¹ - Σ_{t<n} c_t u_t u_tᵀ`` (the hallucinated picks' rank-one terms, summed)."""
    work, limit = V_inv.dtype, UNBOUNDED_PICKS if cap is None else cap
    parts, ids, level, t, n = [], [], 1.0, 0, None
    while n is None:
        ran = chunks(min(size, limit - t))
        read, extra = _read(torch.cat([p.read for p in ran]), extra)
        o = 0
        for p in ran:
            k = p.ids.numel()
            end, level = sum_rule_end(read[o + k: o + 2 * k], level, C, work, stall=cap is None)
            if t + k >= limit:  # the cap's pick (without one, the 2²⁴th) is the last
                end = limit - 1 - t if end is None else min(end, limit - 1 - t)
            parts.append(p)
            ids += read[o: o + k]
            if end is not None:
                n = t + end + 1
                break
            t, o = t + k, o + 2 * k
        if n is None and pick_limit is not None and t >= pick_limit:
            return None
        size = check_every
    idx = torch.cat([p.ids for p in parts])[:n]
    r = Z.shape[1]
    u = torch.cat([p.u for p in parts])[: n - 1, :r]
    g = torch.cat([p.g for p in parts])[: n - 1]
    selection = BatchSelection(indices=idx, rls_start=rls0[idx].to(out_dtype),
                               rls_in_batch=torch.cat([p.rls_in for p in parts])[:n].to(out_dtype),
                               ucb_evaluations=Z.shape[0] * n, V_inv=V_inv - u.T @ (g[:, None] * u))
    return selection, [int(v) for v in ids[:n]]


def _flagged_batch(Z, mean_c, rls0, V_inv, alpha, C, cap, out_dtype, size, check_every, pick_limit, extra):
    """:func:`run_batch_on_device`'s batch with the stop rule on the device (:func:`pick_step`'s done flag): the
    flag, the count and the picks so far read together."""
    A, limit = Z.shape[0], UNBOUNDED_PICKS if cap is None else cap
    state = _start_state(mean_c, rls0, V_inv, alpha)
    picks, in_batch, ids = [], [], []
    t = n = 0
    while t < limit:
        chunk, rls_in = [], []
        for j in range(min(size, limit - t)):
            i, rls_i, state = pick_step(Z, mean_c, rls0, state, alpha, C, cap is None, t + j + 1 >= limit)
            chunk.append(i)
            rls_in.append(rls_i)
        chunk = torch.stack(chunk)
        t += chunk.numel()
        picks.append(chunk)
        in_batch.append(torch.stack(rls_in))
        read, extra = _read(torch.cat([torch.stack([state.done.long(), state.count]), chunk]), extra)
        ids += read[2:]
        n = int(read[1])
        if read[0]:
            break
        if pick_limit is not None and t >= pick_limit:
            return None
        size = check_every
    idx = torch.cat(picks)[:n]
    selection = BatchSelection(indices=idx, rls_start=rls0[idx].to(out_dtype),
                               rls_in_batch=torch.cat(in_batch)[:n].to(out_dtype), ucb_evaluations=A * n,
                               V_inv=state.V_inv)
    return selection, [int(v) for v in ids[:n]]


def _read(values: torch.Tensor, extra: tuple[torch.Tensor, list] | None) -> tuple[list, None]:
    """The one host read of ``values`` (a chunk's), with the caller's ``extra`` flags when given (appended to its
    list): the values as Python numbers, and ``None`` for the flags, read now."""
    if extra is None:
        return values.tolist(), None
    flags, out = extra
    both = torch.cat([flags.to(torch.float64), values.to(torch.float64)]).tolist()
    out += both[: flags.numel()]
    return both[flags.numel():], None
