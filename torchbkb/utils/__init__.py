"""Internal helpers: atomic ``load_state_dict`` (:mod:`torchbkb.utils.state_loading`), host-to-device copies
with no host wait (:mod:`torchbkb.utils.host_copy`)."""
