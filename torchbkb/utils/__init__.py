"""Internal helpers: atomic ``load_state_dict`` (:mod:`torchbkb.utils.state_loading`)."""
