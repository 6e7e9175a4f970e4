"""The eager and the fixed-capacity updates (the CPU's default and every other device's) driven side by side through
any sequence of what a loop does -- ask, tell (whole, in parts, out of order), discard (with or without
exclusion, a whole batch included), readmit, pickle, reload from a state dict, a rejected NaN tell -- pick the same
arms and keep dictionaries of the same size; a rejected tell changes neither."""

import io
import pickle

import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from torchbkb import BBKB, BKB
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel

from helpers import same_state

ARMS = torch.rand(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
F = torch.sin(4 * ARMS[:, 0]) + ARMS[:, 1]


def _make(cls, noise: float, fixed: bool):
    kw = {"max_batch_size": 16} if cls is BBKB else {}  # no stall regime: batches of 10⁵ repeats of one arm
    b = cls(ARMS, GaussianKernel(0.3), noise=noise, beta=0.5, seed=0, **kw)
    b.fixed_capacity = fixed
    return b


class UpdateModes(RuleBasedStateMachine):
    @initialize(cls=st.sampled_from([BKB, BBKB]), noise=st.sampled_from([0.01, 0.1, 1.0]))
    def build(self, cls, noise):
        self.cls, self.noise = cls, noise
        self.pair = [_make(cls, noise, False), _make(cls, noise, True)]
        self.step = 0

    def _asked(self) -> torch.Tensor:
        asks = [b.ask() for b in self.pair]
        assert asks[0].tolist() == asks[1].tolist()
        return asks[0]

    def _rewards(self, idx: torch.Tensor) -> torch.Tensor:
        self.step += 1
        g = torch.Generator().manual_seed(self.step)
        return F[idx] + 0.1 * torch.randn(len(idx), generator=g, dtype=torch.float64)

    @rule(reverse=st.booleans(), parts=st.integers(1, 3))
    def tell(self, reverse, parts):
        idx = self._asked()
        order = torch.arange(len(idx)).flip(0) if reverse else torch.arange(len(idx))
        y = self._rewards(idx)
        for chunk in order.tensor_split(min(parts, len(idx))):
            for b in self.pair:
                b.tell(idx[chunk], y[chunk])

    @rule(whole=st.booleans(), exclude=st.booleans())
    def discard(self, whole, exclude):
        idx = self._asked()
        exclude = exclude and len(self.pair[0].exclusions) < 20  # arms left to select
        gone = idx if whole else idx[:1]
        for b in self.pair:
            b.discard(gone, exclude=exclude)
            if not whole and len(idx) > 1:
                b.tell(idx[1:], F[idx[1:]])

    @rule()
    def readmit(self):
        for b in self.pair:
            b.readmit()

    @rule(how=st.sampled_from(["pickle", "state_dict"]))
    def copy(self, how):
        if how == "pickle":
            self.pair = [pickle.loads(pickle.dumps(b)) for b in self.pair]
            return
        fresh = []
        for b, fixed in zip(self.pair, (False, True)):
            buf = io.BytesIO()
            torch.save(b.state_dict(), buf)
            buf.seek(0)
            twin = _make(self.cls, self.noise, fixed)
            twin.load_state_dict(torch.load(buf, weights_only=True))
            fresh.append(twin)
        self.pair = fresh

    @rule()
    def rejected_tell(self):
        idx = self._asked()
        for b in self.pair:
            before = b.state_dict()
            try:
                b.tell(idx[:1], torch.tensor([float("nan")], dtype=torch.float64))
                raise AssertionError("a NaN reward was accepted")
            except InputDataError:
                pass
            assert same_state(b.state_dict(), before)

    @invariant()
    def same_state(self):
        if hasattr(self, "pair"):
            a, b = self.pair
            assert a.t == b.t and a.dictionary_size == b.dictionary_size and a.pending_ids == b.pending_ids


UpdateModes.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_update_modes_make_the_same_choices = UpdateModes.TestCase
