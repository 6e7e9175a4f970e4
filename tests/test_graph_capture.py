"""Graphs captured per owner: each owner's own stream, all its graphs dropped at once; another owner's graphs keep
replaying what they captured."""

import pickle

import pytest
import torch

from torchbkb.utils.graph_capture import GraphStream


def test_the_flush_rule_counts_graphs_and_bytes():
    rule = GraphStream.needs_flush
    assert not rule(kept=0, keep=1, kept_bytes=0, new_bytes=10**12, max_bytes=1)  # nothing to drop
    assert rule(kept=2, keep=2, kept_bytes=0, new_bytes=0, max_bytes=1)
    assert rule(kept=1, keep=8, kept_bytes=60, new_bytes=50, max_bytes=100)
    assert not rule(kept=1, keep=8, kept_bytes=50, new_bytes=50, max_bytes=100)


def test_a_flush_drops_every_graph_and_a_stream_is_not_pickled():
    stream, graphs = GraphStream(), {"a": 1, "b": 2}
    stream.flush(graphs)
    assert graphs == {}
    assert pickle.loads(pickle.dumps(stream)).__dict__ == {"_streams": {}}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_graphs_of_another_owner_replay_after_one_owner_drops_its_own():
    x = torch.randn(256, 256, device="cuda")
    owners, graphs = [GraphStream(), GraphStream()], [{}, {}]
    for owner, held in zip(owners, graphs):
        held["g"] = owner.capture(lambda: x @ x, x.device)
    owners[0].flush(graphs[0])
    torch.cuda.synchronize()
    x.copy_(torch.randn_like(x))
    out, graph = graphs[1]["g"]
    graph.replay()
    torch.testing.assert_close(out, x @ x)
