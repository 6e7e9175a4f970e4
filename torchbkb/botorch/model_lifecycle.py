"""What a :class:`~torchbkb.botorch.BKBModel` must survive besides predicting: hyperparameter changes, threads,
copies, pickles, state dicts, ``.to()``, new training data (``set_train_data``).

* **Never stale.** The posterior (:attr:`ModelLifecycle.engine`) is a snapshot at the hyperparameters' values
  (parameters and floating buffers of the kernel, likelihood and mean): read after any of them changed -- a fit,
  ``load_state_dict``, an assignment, in training or eval mode -- it is rebuilt from all the model's data.
* **Threads.** The posterior is built lazily, under the model's lock, and a built engine is never modified, so
  threads that share a model read the same posterior and draw the same seeded dictionary as a sequential run.
* **Pickle, ``copy.deepcopy``, ``torch.save``.** The lock is left out and made anew; a posterior conditioned on
  observations that carry an autograd graph (a fantasy) is left out too and rebuilt from the model's data.
* **``load_state_dict``** checks every entry first and copies all of them or none
  (:func:`~torchbkb.utils.state_loading.load_state_dict_atomically`); the posterior follows the new values.
* **Derived models** (conditioned, by ``condition_on_observations`` or GPyTorch's ``get_fantasy_model``, and
  hallucinated) own copies of the hyperparameter modules and transforms, as ``SingleTaskGP``'s fantasy models do:
  fitting one never moves the other.

Example:
    >>> import pickle, torch
    >>> from torchbkb.botorch import BKBModel
    >>> X = torch.rand(20, 2, dtype=torch.float64)
    >>> model = BKBModel(X, X.sum(-1, keepdim=True), seed=0)
    >>> Xq = torch.rand(3, 1, 2, dtype=torch.float64)
    >>> mean = model.posterior(Xq).mean
    >>> bool(torch.equal(pickle.loads(pickle.dumps(model)).posterior(Xq).mean, mean))
    True
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import torch
from torch import Tensor, nn

from torchbkb.botorch.conditioning import shallow_module_copy
from torchbkb.botorch.defaults import hyperparameter_values, same_values
from torchbkb.botorch.engine import ModelEngine
from torchbkb.botorch.model_data import ModelData
from torchbkb.botorch.training_data import check_observations
from torchbkb.errors import InputDataError, check_finite
from torchbkb.gp.observations import check_values
from torchbkb.utils.host_copy import read_flags
from torchbkb.utils.state_loading import load_state_dict_atomically

__all__ = ["ModelLifecycle", "OWNED_MODULES"]

#: The submodules a derived model owns copies of.
OWNED_MODULES = ("covar_module", "likelihood", "mean_module", "input_transform", "outcome_transform")


class ModelLifecycle:
    """Mixin of :class:`~torchbkb.botorch.BKBModel`: the lock, pickling, atomic state loading, derived copies."""

    def _init_lifecycle(self) -> None:
        self._lock = threading.RLock()

    @property
    def engine(self) -> ModelEngine:
        """The posterior at the current hyperparameters, rebuilt from all the model's data if any changed since."""
        return self.engine_for(None)

    def engine_for(self, X: Tensor | None, name: str = "X") -> ModelEngine:
        """:attr:`engine` for a query ``X`` `(*b, q, d)`, checked finite in the same host read as the hyperparameters'
        snapshot (a GPU waits once per query, not twice); a non-finite ``X`` raises before anything is built."""
        with self._lock:
            values = hyperparameter_values(self.covar_module, self.likelihood, self.mean_module)
            same = self._engine is not None and same_values(values, self._snapshot)
            checks = {} if X is None else {"finite": torch.isfinite(X.detach()).all()}
            if isinstance(same, Tensor):
                checks["same"] = same
            read = read_flags(checks)
            if not read.get("finite", True):
                check_finite(X.detach(), name)  # raises, with the count
            if not read.get("same", same):
                self._build(values)
            return self._engine

    def last_engine(self) -> ModelEngine:
        """The posterior last built (at the hyperparameters of that moment; built now if there is none): what a
        fitting step reads for a valid set of inducing points without re-drawing a dictionary at every step."""
        with self._lock:
            return self.engine if self._engine is None else self._engine

    def _apply(self, fn, recurse: bool = True):
        out = super()._apply(fn, recurse)
        if self.__dict__.get("_data") is not None:  # data and posterior are moved with the model
            self._data = self._data.apply(fn)
        if self.__dict__.get("_engine") is not None:
            self._engine.apply(fn)
            if self._snapshot is not None:
                self._snapshot = fn(self._snapshot)
        return out

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        engine = state.get("_engine")
        if engine is not None and engine.has_graph:  # a graph neither pickles nor deep-copies: rebuilt on demand
            state["_engine"] = state["_snapshot"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._lock = threading.RLock()

    def load_state_dict(self, state_dict, strict: bool = True, keep_transforms: bool = True, assign: bool = False):
        """BoTorch's ``load_state_dict``, all entries or none: a state dict of another dimension or kernel, a
        truncated one or one with NaN raises :class:`~torchbkb.errors.InputDataError` and changes nothing. With
        ``keep_transforms`` (BoTorch's default) the data are re-transformed by the loaded transforms, as
        ``SingleTaskGP`` re-transforms its training targets; the posterior is rebuilt when next read."""
        with self._lock:
            try:
                originals = self._data.map_blocks(self._untransform) if keep_transforms else None
            except NotImplementedError:  # a transform that cannot untransform: loaded as is (as BoTorch does)
                originals = None

            def load(module, sd, strict, assign):
                out = nn.Module.load_state_dict(module, sd, strict=strict, assign=assign)
                if originals is not None:
                    module._data = originals.map_blocks(module._retransform)  # the last step: rolled back as one
                return out

            result = load_state_dict_atomically(self, load, state_dict, strict, assign=assign)
            self._engine = self._snapshot = None
            return result

    def set_train_data(self, inputs=None, targets=None, strict: bool = True) -> None:
        """GPyTorch's ``ExactGP.set_train_data``: new training data in the spaces of :attr:`train_inputs` and
        :attr:`train_targets` -- ``inputs`` `(*batch, n, d)` (or a one-tuple of it) transformed, ``targets``
        `(*batch, n)` outcome-transformed; ``None`` keeps the current ones. With ``strict`` their shapes must be the
        current ones; their dtype and device are the model's always. The hyperparameters stay; the posterior, its
        dictionary drawn again, is rebuilt when next read. Known noise (``train_Yvar``) stays with its points, whose
        number may not change then. Bad data raise :class:`~torchbkb.errors.InputDataError` and change nothing."""
        X_old, y_old = self.train_inputs[0], self.train_targets
        if isinstance(inputs, (tuple, list)) and len(inputs) == 1:
            inputs = inputs[0]
        X, y = X_old if inputs is None else inputs, y_old if targets is None else targets
        for name, new, old in (("inputs", X, X_old), ("targets", y, y_old)):
            if not isinstance(new, Tensor):
                raise InputDataError(f"{name}: expected a torch.Tensor, got {type(new).__name__}")
            if (strict and new.shape != old.shape) or new.dtype != old.dtype or new.device != old.device:
                raise InputDataError(f"{name}: expected {'shape ' + str(tuple(old.shape)) + ', ' if strict else ''}"
                                     f"dtype {old.dtype} on {old.device} (the model's), got shape {tuple(new.shape)}, "
                                     f"dtype {new.dtype} on {new.device}")
        d, hyper = X_old.shape[-1], tuple(self._hyper_batch)
        if X.dim() < 2 or X.shape[-2] < 1 or X.shape[-1] != d or X.dim() - 2 < len(hyper) or \
                X.shape[X.dim() - 2 - len(hyper):-2] != hyper:
            raise InputDataError(f"inputs: expected shape (*batch, n >= 1, {d}) with batch ending in {hyper} (one set "
                                 f"of hyperparameters each), got {tuple(X.shape)}")
        if y.shape != X.shape[:-1]:
            raise InputDataError(f"targets: expected shape {tuple(X.shape[:-1])} (one per input), got {tuple(y.shape)}")
        check_values(X, y, None, "inputs", "targets")  # both in one read, the same errors
        noise = self._data.noise(self._default_noise()) if self._data.has_noise else None
        if noise is not None and noise.shape[-1] != X.shape[-2]:
            raise InputDataError(f"inputs: expected {noise.shape[-1]} points (the known noise of train_Yvar stays with "
                                 f"them), got {X.shape[-2]}")
        with self._lock:
            self._data = ModelData(X, y, None if noise is None else noise.expand(*y.shape))
            self._engine = self._snapshot = None

    def get_fantasy_model(self, inputs: Tensor, targets: Tensor, noise: Tensor | None = None, **kwargs) -> Any:
        """GPyTorch's ``ExactGP.get_fantasy_model`` (what ``ModelListGP.condition_on_observations`` calls): a new
        model conditioned on ``inputs`` `(*batch, n', d)` and ``targets`` `(*batch', n')` in the spaces of
        :attr:`train_inputs` and :attr:`train_targets`, ``noise`` `(*batch', n')` or ``None`` (``λ``)."""
        if kwargs:
            raise InputDataError(f"get_fantasy_model: expected no keyword besides noise, got {sorted(kwargs)}")
        self.check_query(inputs, "inputs")
        if not isinstance(targets, Tensor) or targets.dim() < 1 or targets.shape[-1] != inputs.shape[-2]:
            raise InputDataError(f"targets: expected a tensor of shape (*batch, {inputs.shape[-2]}), got "
                                 f"{tuple(targets.shape) if isinstance(targets, Tensor) else type(targets).__name__}")
        Y, Yvar = targets.unsqueeze(-1), None if noise is None else noise.unsqueeze(-1)
        batch = check_observations(inputs, Y, Yvar, self.batch_shape)
        return self._conditioned(inputs, targets.to(inputs), None if noise is None else noise.to(inputs), batch)

    def _conditioned(self, X_tf: Tensor, y_tf: Tensor, noise: Tensor | None, batch: torch.Size) -> Any:
        """A derived model (:meth:`derived_copy`) whose posterior adds ``X_tf`` `(*b, n', d)` and ``y_tf``
        `(*b', n')`, with ``noise`` `(*b', n')` or ``None``, in the training spaces (checked already; ``batch``
        their broadcast batch shape), without refitting (same dictionary), differentiably."""
        with self._lock:
            engine = self.engine
            new = self.derived_copy()
            new._engine = engine.condition(X_tf, y_tf - self.mean_constant.to(y_tf).unsqueeze(-1), noise, batch)
            new._snapshot = self._snapshot
        new._data = self._data.append(X_tf, y_tf, noise)
        return new

    def _untransform(self, block):
        """``(X, Y, Yvar)`` of a data block in the original spaces (`(*b, k, d)`, `(*b, k, 1)`, `(*b, k, 1)`)."""
        X, Y, Yvar = block.X, block.y.unsqueeze(-1), None if block.noise is None else block.noise.unsqueeze(-1)
        with torch.no_grad():
            if getattr(self, "outcome_transform", None) is not None:
                self.outcome_transform.eval()
                Y, Yvar = self.outcome_transform.untransform(Y, Yvar, X=X)
            if getattr(self, "input_transform", None) is not None:
                X = self.input_transform.untransform(X)
        return X, Y, Yvar

    def _retransform(self, original):
        """A block's ``(X, y, noise)`` in the (newly loaded) transformed spaces, from :meth:`_untransform`."""
        X, Y, Yvar = original.X, original.y, original.noise
        with torch.no_grad():
            if getattr(self, "input_transform", None) is not None:
                self.input_transform.eval()
                X = self.input_transform(X)
            if getattr(self, "outcome_transform", None) is not None:
                self.outcome_transform.eval()
                Y, Yvar = self.outcome_transform(Y, Yvar, X=X)
        return X, Y.squeeze(-1), None if Yvar is None else Yvar.squeeze(-1)

    def derived_copy(self):
        """A new model object sharing this one's data and settings, with its own copies of the hyperparameter
        modules and transforms and its own lock (what ``condition_on_observations`` returns)."""
        new = shallow_module_copy(self)
        for name in OWNED_MODULES:
            module = getattr(self, name, None)
            if isinstance(module, nn.Module):
                setattr(new, name, copy.deepcopy(module))  # into the copy's own module table
        new._lock = threading.RLock()
        return new
