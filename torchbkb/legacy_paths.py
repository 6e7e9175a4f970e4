"""The module paths of torchbkb before the package was grouped by layer, kept importable.

Every name a user imported from an old path (``from torchbkb.kernels import GaussianKernel``), pickled under one
(``torchbkb.dtc_posterior.DTCPosterior``) or patched through one resolves to the same module object as its new
path: :func:`install` puts a finder on ``sys.meta_path`` that answers an old path, when it is first imported, with
the module that lives at the new one (after its parent package, as any import would).

Example:
    >>> import torchbkb.kernels, torchbkb.gp.kernels
    >>> torchbkb.kernels is torchbkb.gp.kernels
    True
    >>> MOVED["torchbkb.dtc_posterior"]
    'torchbkb.gp.dtc_posterior'
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

__all__ = ["MOVED", "LegacyPathFinder", "install"]

#: Old module path -> the module path it lives at now.
MOVED = {
    "torchbkb.kernels": "torchbkb.gp.kernels",
    "torchbkb.nystrom": "torchbkb.gp.nystrom",
    "torchbkb.dtc_posterior": "torchbkb.gp.dtc_posterior",
    "torchbkb.exact_posterior": "torchbkb.gp.exact_posterior",
    "torchbkb.functional": "torchbkb.gp.functional",
    "torchbkb.evidence_bound": "torchbkb.gp.evidence_bound",
    "torchbkb.utils.linalg": "torchbkb.gp.linalg",
    "torchbkb.stable_scoring": "torchbkb.gp.stable_scoring",
    "torchbkb.observations": "torchbkb.gp.observations",
    "torchbkb.scoring_chunk": "torchbkb.gp.scoring_chunk",
    "torchbkb.rls_dictionary": "torchbkb.sampling.rls_dictionary",
    "torchbkb.recursive_rls": "torchbkb.sampling.recursive_rls",
    "torchbkb.botorch.dictionary_sampling": "torchbkb.sampling.dictionary_replay",
    "torchbkb.botorch.exact_state": "torchbkb.gp.exact_gp_state",
    "torchbkb.confidence": "torchbkb.bandits.confidence",
    "torchbkb.theorems": "torchbkb.bandits.theorems",
    "torchbkb.batch_selection": "torchbkb.bandits.batch_selection",
    "torchbkb.design": "torchbkb.bandits.design",
    "torchbkb.device_batch": "torchbkb.bandits.device_batch",
    "torchbkb.fantasy_batch": "torchbkb.bandits.fantasy_batch",
    "torchbkb.loop": "torchbkb.experiment.loop",
    "torchbkb.evaluation": "torchbkb.experiment.evaluation",
    "torchbkb.checkpoint": "torchbkb.experiment.checkpoint",
    "torchbkb.history": "torchbkb.experiment.history",
}


class LegacyPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path of :data:`MOVED` and loads it as the module at its new path (the same object)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def __init__(self):
        self.specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        self.specs[spec.name] = module.__spec__  # the import system sets __spec__ to the old path's; restored below
        return module

    def exec_module(self, module) -> None:
        """Nothing to run (the module at the new path is already executed); its own ``__spec__`` goes back."""
        module.__spec__ = self.specs.pop(module.__spec__.name)


def install() -> None:
    """Put one :class:`LegacyPathFinder` on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, LegacyPathFinder) for f in sys.meta_path):
        sys.meta_path.append(LegacyPathFinder())
