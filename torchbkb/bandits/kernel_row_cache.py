"""The kernel rows a sketched bandit scores from: ``k(x, arms)`` of the pulled arms and ``k(S, arms)`` of the
dictionary.

Two caches, both `(rows, A)` in the arms' dtype:

* **pulled rows** -- ``k(x, arms)`` of every pulled arm, computed alone at its first pull. Only pulled arms
  enter a dictionary, and Bernoulli resampling changes a large part of it at every step, so an entering
  point is copied from here instead of re-evaluated. Dropped for good when the pulled arms outgrow
  ``row_cache_bytes``.
* **dictionary rows** -- ``k(s, arms)`` for the current dictionary, in *slot order* (:attr:`KernelRowCache.order`):
  rows of points that stay are not touched when the dictionary changes. Past ``kernel_cache_bytes`` they are
  recomputed on demand instead (:class:`~torchbkb.bandits.kernel_rows.StreamedKernelRows`).

A kernel block can differ in its last bits from its rows computed alone, so the cache records which rows were
evaluated together (:meth:`KernelRowCache.blocks`); a bandit resumed from a checkpoint passes them back to
:meth:`KernelRowCache.set_dictionary` and rebuilds the same rows bitwise, hence the same choices.

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> arms = torch.rand(50, 2, dtype=torch.float64)
    >>> cache = KernelRowCache(GaussianKernel(0.5), arms)
    >>> cache.add_pulled([3, 7])
    >>> cache.set_dictionary(torch.tensor([3, 7]))
    >>> cache.order, bool(torch.allclose(cache.rows(), GaussianKernel(0.5)(arms[[3, 7]], arms)))
    ([3, 7], True)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torchbkb.bandits.kernel_rows import StreamedKernelRows, finite_flag, finite_rows
from torchbkb.errors import TorchBKBError, nonfinite_rows_error
from torchbkb.gp.nystrom import DEFAULT_CHUNK
from torchbkb.gp.scoring_chunk import check_chunk_size, scoring_chunk
from torchbkb.utils.host_copy import to_device

__all__ = ["AGAINST_BYTES", "KERNEL_CACHE_BYTES", "REFILL_BYTES", "ROW_CACHE_BYTES", "KernelRowCache"]

#: default memory for the kernel rows of the pulled arms.
ROW_CACHE_BYTES = 256 * 2**20
#: the dictionary's kernel rows are cached up to ``max(KERNEL_CACHE_BYTES, 10 × the arms' bytes)`` by default.
KERNEL_CACHE_BYTES = 256 * 2**20
#: dictionary kernel rows up to this size are refilled whole from the pulled-row cache when the dictionary changes.
REFILL_BYTES = 4 * 2**20
#: kernel rows are computed against a centred, scaled copy of the arms kept while the arms take at most this.
AGAINST_BYTES = 64 * 2**20


class KernelRowCache:
    """Kernel rows of the pulled arms and of the dictionary, for an arm set ``arms`` `(A, d)`.

    Args:
        kernel: callable ``(X1, X2) -> Tensor`` (a :class:`~torchbkb.gp.kernels.KernelAdapter`).
        arms: `(A, d)` the arm set.
        chunk_size: arms per kernel call when the dictionary's rows are streamed; ``None`` sizes it for the device
            (:func:`~torchbkb.gp.scoring_chunk.scoring_chunk`: a GPU takes far larger chunks than the CPU's).
        row_cache_bytes: memory for the pulled arms' rows (see the module docstring).
        kernel_cache_bytes: memory for the dictionary's rows; default ``max(KERNEL_CACHE_BYTES, 10 × arms' bytes)``.

    Attributes:
        order: the dictionary's arms in slot order (row ``j`` of :meth:`rows` is ``k(arms[order[j]], arms)``).
        order_index: ``order`` as a `(m,)` long tensor.
    """

    def __init__(self, kernel: Callable, arms: torch.Tensor, *, chunk_size: int | None = DEFAULT_CHUNK,
                 row_cache_bytes: int = ROW_CACHE_BYTES, kernel_cache_bytes: int | None = None):
        self.kernel, self.arms, self.chunk_size = kernel, arms, check_chunk_size(chunk_size)
        self.row_cache_bytes = int(row_cache_bytes)
        self.kernel_cache_bytes = (max(KERNEL_CACHE_BYTES, 10 * arms.numel() * arms.element_size())
                                   if kernel_cache_bytes is None else int(kernel_cache_bytes))
        # arm -> row of _P_buf (-1: none)
        self._P_row = torch.full((arms.shape[0],), -1, dtype=torch.long, device=arms.device)
        self._rows_of: Callable[[torch.Tensor], torch.Tensor] | None = None  # X1 -> k(X1, arms), made at first use
        self.reset()

    def reset(self) -> None:
        """Forget every row (pulled and dictionary); the pulled-row cache is enabled again."""
        self._P_buf: torch.Tensor | None = None  # (capacity, A) k(x, arms) of the pulled arms, by first pull
        self._P_pos: dict[int, int] | None = {}  # arm -> row of _P_buf; None once the cache is dropped
        self._P_row.fill_(-1)
        self.clear()
        self._next_block = 0

    def clear(self) -> None:
        """Forget the dictionary's rows (an empty dictionary); the pulled rows stay."""
        self._K_buf: torch.Tensor | None = None  # (capacity, A), the first m rows used
        self.order: list[int] = []
        self.order_index = self._long([])
        # for each slot, the id of the kernel block its row was computed in (-1: alone)
        self._slot_block: list[int] = []
        self._blocks: dict[int, list[int]] = {}  # block id -> the arms evaluated together in that call

    # ------------------------------------------------------------------ reading
    @property
    def streams(self) -> bool:
        """Whether the dictionary's rows are recomputed on demand (they exceed ``kernel_cache_bytes``)."""
        return self._K_buf is None and bool(self.order)

    @property
    def caches_pulled_rows(self) -> bool:
        """Whether the pulled arms' rows are still kept (``False`` once they outgrew ``row_cache_bytes``)."""
        return self._P_pos is not None

    @property
    def num_pulled_rows(self) -> int:
        """How many pulled arms' rows are cached (0 once the cache is dropped)."""
        return 0 if self._P_pos is None else len(self._P_pos)

    def caches(self, m: int) -> bool:
        """Whether the kernel rows of a dictionary of ``m`` points are kept (within ``kernel_cache_bytes``); past it
        they are streamed."""
        return m * self.arms.shape[0] * self.arms.element_size() <= self.kernel_cache_bytes

    def pulled_rows(self, arms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(buffer, where)``: the pulled-row buffer `(capacity, A)` and the `(k,)` rows of ``arms`` `(k,)` in it
        (``buffer[where[i]]`` is ``k(arms[i], arms)``, computed alone); for arms whose rows are all cached."""
        if self._P_pos is None or self._P_buf is None:
            raise TorchBKBError("KernelRowCache: expected cached pulled rows, got a dropped cache")
        return self._P_buf, self._P_row.index_select(0, arms)

    def adopt(self, order: list[int], index: torch.Tensor, buffer: torch.Tensor) -> None:
        """Take rows computed elsewhere as the dictionary's: ``buffer[j]`` `(≥ m, A)` is ``k(arms[order[j]], arms)``,
        copied from the pulled rows (so each as computed alone); ``index`` is ``order`` as a `(m,)` long tensor."""
        self._K_buf, self.order, self.order_index = buffer, list(order), index
        self._slot_block, self._blocks = [-1] * len(self.order), {}

    def rows(self) -> torch.Tensor | StreamedKernelRows:
        """The `(m, A)` kernel rows of the dictionary in slot order: a view of the cache, or streamed."""
        if self._K_buf is not None:
            return self._K_buf[: len(self.order)]
        chunk = scoring_chunk(self.chunk_size, len(self.order), self.arms.device, self.arms.dtype)
        return StreamedKernelRows(self.kernel, self.arms[self.order_index], self.arms, chunk_size=chunk, ids=self.order)

    def blocks(self) -> list[list[int]]:
        """The arms whose rows were evaluated together, one list per kernel call (rows computed alone: one each)."""
        together = [self._blocks[b] for b in sorted(set(self._slot_block) - {-1})]
        return together + [[a] for a, b in zip(self.order, self._slot_block) if b == -1]

    def nonfinite_rows(self, arms: list[int]) -> list[int]:
        """Those of ``arms`` whose kernel rows ``k(a, arms)`` hold NaN/inf, computed again a few rows at a time (to
        name the arms behind an error found in rows computed together)."""
        step = max(1, REFILL_BYTES // (self.arms.shape[0] * self.arms.element_size()))
        bad = []
        for i in range(0, len(arms), step):
            part = arms[i : i + step]
            rows = self._kernel_rows(self.arms[self._long(part)])
            bad += [a for a, ok in zip(part, torch.isfinite(rows).all(1).tolist()) if not ok]
        return bad

    def snapshot(self) -> tuple:
        """The dictionary's rows as they are now, for :meth:`restore` (references: nothing is copied)."""
        buf = self._K_buf
        return buf, None if buf is None else buf._version, self.order, self.order_index, self._slot_block, self._blocks

    def restore(self, snapshot: tuple) -> None:
        """The dictionary's rows as at :meth:`snapshot` (the pulled rows stay as they are): its references put back,
        or, when its cache was written over since, its rows computed again, each in the block it was computed in."""
        self._K_buf, version, self.order, self.order_index, self._slot_block, self._blocks = snapshot
        if self._K_buf is not None and self._K_buf._version != version:
            self.set_dictionary(self.order_index, order=self.order, blocks=self.blocks())

    # ------------------------------------------------------------------ writing
    def add_pulled(self, arms: list[int], check: bool = True) -> tuple[list[int], torch.Tensor | bool] | None:
        """Add ``k(x, arms)`` of newly pulled arms, each row computed alone (a resumed run recomputes it
        bitwise); drop the pulled-row cache for good when it would outgrow ``row_cache_bytes``.

        With ``check`` (default) a non-finite row raises before it is recorded (one host read). Without, the rows
        are recorded at once and ``(new arms, finite)`` returned -- ``finite`` a 0-d bool on the device for the
        caller to read with something else (a Python bool where NumPy scans the rows), and to
        :meth:`reject_pulled` the arms when it is false; ``None`` when no row was added."""
        if self._P_pos is None:
            return None
        new = [a for a in dict.fromkeys(arms) if a not in self._P_pos]
        if not new:
            return None
        A, size = self.arms.shape[0], self.arms.element_size()
        n = len(self._P_pos) + len(new)
        if n * A * size > self.row_cache_bytes:
            self._P_buf, self._P_pos = None, None
            self._P_row.fill_(-1)
            return None
        buf = self._P_buf
        if buf is None or buf.shape[0] < n:  # grow geometrically, within the budget
            cap = min(max(16, 2 * n), max(n, self.row_cache_bytes // (A * size)))
            grown = self.arms.new_empty((cap, A))
            if buf is not None:
                grown[: len(self._P_pos)] = buf[: len(self._P_pos)]
            buf = self._P_buf = grown
        with torch.no_grad():
            first = len(self._P_pos)
            for j, a in enumerate(new):  # each row alone; checked together (one host read), then recorded
                buf[first + j] = self._kernel_rows(self.arms[a : a + 1])[0]
            if check:
                finite_rows(buf[first : first + len(new)], new)
            for j, a in enumerate(new):
                self._P_pos[a] = first + j
            if len(new) == 1:  # the usual case: one write, no index tensors
                self._P_row[new[0]] = first
            else:
                self._P_row[self._long(new)] = torch.arange(first, first + len(new), device=self.arms.device)
        if check:
            return None
        return new, finite_flag(buf[first : first + len(new)])

    def reject_pulled(self, arms: list[int]) -> None:
        """Of ``arms``, the last ones :meth:`add_pulled` added (``check=False``), drop the rows that are not finite
        (the finite ones move up into their places: the cache stays compact) and raise the
        :class:`~torchbkb.errors.NumericsError` naming those arms."""
        first = min(self._P_pos[a] for a in arms)
        finite = torch.isfinite(self._P_buf[first : first + len(arms)]).all(1).tolist()
        bad, kept = [a for a, ok in zip(arms, finite) if not ok], [a for a, ok in zip(arms, finite) if ok]
        if not bad:
            raise TorchBKBError(f"KernelRowCache: expected non-finite rows for {arms}, got finite ones")
        for a in bad:
            del self._P_pos[a]
        self._P_row[self._long(bad)] = -1
        for j, a in enumerate(kept):  # in their order: each row moves up or stays
            if self._P_pos[a] != first + j:
                self._P_buf[first + j] = self._P_buf[self._P_pos[a]]
                self._P_pos[a] = self._P_row[a] = first + j
        raise nonfinite_rows_error(bad)

    def set_dictionary(self, dictionary: torch.Tensor, order: list[int] | None = None,
                       blocks: list[list[int]] | None = None, *, ids: list[int] | None = None) -> None:
        """Make :meth:`rows` hold ``k(s, arms)`` for every point ``s`` of ``dictionary`` `(m,)` (ascending arm indices).

        ``order`` and ``blocks`` (resuming from a checkpoint: a saved :attr:`order` and :meth:`blocks`) rebuild
        the saved slot order with each row computed in the block it was first computed in. ``ids``: ``dictionary``
        as Python ints, when the caller has them (no read of the device).
        """
        m = dictionary.numel()
        if order is None and ids is None:  # read once, only when no saved order gives the slots
            ids = dictionary.tolist()
        with torch.no_grad():
            # streamed: slot order = the dictionary's
            if not self.caches(m):
                self._K_buf, self.order = None, list(order if order is not None else ids)
                self.order_index, self._slot_block, self._blocks = self._long(self.order), [-1] * len(self.order), {}
            elif order is None:
                if self._K_buf is None:  # cached again after streaming: every row enters
                    self.order, self._slot_block, self._blocks = [], [], {}
                self._update(ids, dictionary)
            else:
                self._K_buf, self.order, self._slot_block, self._blocks = None, [], [], {}
                self._update(list(order), blocks=blocks)

    def _update(self, new_dict: list[int], new_idx: torch.Tensor | None = None, *,
                blocks: list[list[int]] | None = None) -> None:
        """Bring the rows up to date: rows of points that stay are not touched; a leaving point's slot is given to an
        entering point (or to the last row, to keep the cache compact). Entering points with a cached pulled row are
        copied; the others are evaluated together in one ``k(X_entering, arms)`` `(e, A)` call, recorded as a block.
        When every point's row is a cached pulled row and the rows are small (at most :data:`REFILL_BYTES`) or at
        least half of the points are new, the cache is refilled whole in ``new_dict``'s order (one ``index_select``).
        """
        A = self.arms.shape[0]
        if blocks is None and self._P_pos is not None:
            m = len(new_dict)
            small = m * A * self.arms.element_size() <= REFILL_BYTES
            wanted = set(new_dict)
            if self._P_pos.keys() >= wanted and (small or 2 * len(wanted - set(self.order)) >= m):
                buf = self._K_buf
                if buf is None or buf.shape[0] < m:  # grow geometrically (every row is rewritten below)
                    buf = self.arms.new_empty((max(16, 2 * m), A))
                idx = self._long(new_dict) if new_idx is None else new_idx
                torch.index_select(self._P_buf, 0, self._P_row[idx], out=buf[:m])
                self._K_buf, self.order, self.order_index = buf, list(new_dict), idx
                self._slot_block, self._blocks = [-1] * m, {}
                return
        want = set(new_dict)
        order, slot_block = list(self.order), list(self._slot_block)  # state changes only at the end
        have = set(order)
        entering = [a for a in new_dict if a not in have]  # ascending (new_dict is sorted or a saved order)
        copied = blocks is None and self._P_pos is not None and all(a in self._P_pos for a in entering)
        # the entering points' rows (one kernel call) are computed and checked before anything is written: an error
        # changes nothing; resuming (the cache cleared, nothing to keep) computes one saved block at a time
        computed = ([] if copied or not entering else [(entering, self._checked_rows(entering))]) if blocks is None \
            else ((members, self._checked_rows(members)) for members in blocks if members)
        holes = [p for p, a in enumerate(order) if a not in want]
        n_fill = min(len(holes), len(entering))
        compute = holes[:n_fill]  # slots to (re)fill
        for p, a in zip(compute, entering):
            order[p] = a
        buf = self._K_buf
        for p in reversed(holes[n_fill:]):  # no entering point left for these: compact
            last = len(order) - 1
            if p != last:
                buf[p] = buf[last]
                order[p], slot_block[p] = order[last], slot_block[last]
            order.pop()
            slot_block.pop()
        for a in entering[n_fill:]:  # the rest go to the end
            compute.append(len(order))
            order.append(a)
            slot_block.append(-1)
        m = len(order)
        if buf is None or buf.shape[0] < m:  # grow the cache geometrically
            grown = self.arms.new_empty((max(16, 2 * m), A))
            if buf is not None:
                keep = min(buf.shape[0], m)
                grown[:keep] = buf[:keep]
            buf = grown
        if compute and copied:  # every entering point is a pulled arm with a cached row (computed alone): copy
            buf.index_copy_(0, self._long(compute), self._P_buf[self._long([self._P_pos[order[p]] for p in compute])])
            for p in compute:
                slot_block[p] = -1  # a block of one: the row as computed alone
        block_of = self._blocks
        if not copied:
            block_of, slot_of = dict(block_of), {a: p for p, a in enumerate(order)}
        for members, rows in computed:  # (e, A): one call per block
            bid = -1
            if len(members) > 1:
                bid, self._next_block = self._next_block, self._next_block + 1
                block_of[bid] = list(members)
            js = [j for j, a in enumerate(members) if a in slot_of]
            slots = [slot_of[members[j]] for j in js]
            if len(js) < len(members):
                rows = rows[self._long(js)]
            buf.index_copy_(0, self._long(slots), rows)  # one scatter for the whole block
            for p in slots:
                slot_block[p] = bid
        if block_of:
            live = set(slot_block)
            block_of = {b: mem for b, mem in block_of.items() if b in live}
        self._K_buf, self.order, self.order_index, self._slot_block = buf, order, self._long(order), slot_block
        self._blocks = block_of

    def _checked_rows(self, members: list[int]) -> torch.Tensor:
        """`(e, A)` ``k(arms[members], arms)`` in one kernel call, checked for NaN/inf (:func:`finite_rows`)."""
        return finite_rows(self._kernel_rows(self.arms[self._long(members)]), members)

    def _kernel_rows(self, X1: torch.Tensor) -> torch.Tensor:
        """`(e, A)` ``k(X1, arms)``, the values of ``kernel(X1, arms)``: with the arms' side of the kernel computed
        once (``kernel.against``, where it has one) while a copy of the arms fits :data:`AGAINST_BYTES`."""
        if self._rows_of is None:
            against = getattr(self.kernel, "against", None)
            small = self.arms.numel() * self.arms.element_size() <= AGAINST_BYTES
            self._rows_of = against(self.arms) if against is not None and small else self._plain_rows
        return self._rows_of(X1)

    def _plain_rows(self, X1: torch.Tensor) -> torch.Tensor:
        return self.kernel(X1, self.arms)

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_rows_of": None}  # formed again where it is used (a closure does not pickle)

    def _long(self, values) -> torch.Tensor:
        return to_device(torch.as_tensor(values, dtype=torch.long).reshape(-1), self.arms.device)
