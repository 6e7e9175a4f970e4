"""Graphs captured per owner: each owner's own stream, all its graphs dropped at once; another owner's graphs keep
replaying what they captured."""

import pickle

import pytest
import torch

from torchbkb.utils.graph_capture import GraphCache


def test_a_cache_drops_every_graph_past_its_count_or_bytes_and_is_not_pickled():
    cache = GraphCache(keep=3, max_bytes=100)
    cache.store("a", 1, 60)
    cache.store("a", 2, 60)  # the same key again: replaced, nothing dropped
    assert len(cache) == 1 and cache.cached("a") == 2
    cache.store("b", 3, 50)  # 60 + 50 > 100: all dropped first
    assert len(cache) == 1 and cache.cached("a") is None
    for k in "cde":
        cache.store(k, 0, 1)
    assert len(cache) == 1 and cache.cached("e") == 0  # a fourth graph past keep = 3
    copy = pickle.loads(pickle.dumps(cache))
    assert len(copy) == 0 and copy.keep == 3 and copy.stream.__dict__ == {"_streams": {}}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_graphs_of_another_owner_replay_after_one_owner_drops_its_own():
    x = torch.randn(256, 256, device="cuda")
    owners = [GraphCache(keep=2, max_bytes=2**30), GraphCache(keep=2, max_bytes=2**30)]
    for owner in owners:
        owner.store("g", owner.stream.capture(lambda: x @ x, x.device), 0)
    owners[0].clear()
    x.copy_(torch.randn_like(x))
    out, graph = owners[1].cached("g")
    graph.replay()
    torch.testing.assert_close(out, x @ x)
