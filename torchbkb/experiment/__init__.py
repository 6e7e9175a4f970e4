"""Running an experiment: the ask/evaluate/tell loop (:func:`torchbkb.run`), the evaluation of objectives (in
process or on a Dask executor), checkpoints, and the run's history. The package is named ``experiment`` because
``torchbkb.run`` is the loop function itself; import the modules (``torchbkb.experiment.loop``, ...) by name.
"""
