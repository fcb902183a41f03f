"""training/prefetch.py: the next steps' batches read on a thread, in order, and the thread gone however
the loop ends; a failure in the thread arrives on the main thread as it was raised.

    python -m pytest -q tests/test_prefetch.py      # a second
"""

from __future__ import annotations

import threading

import pytest
import torch


def load_step(step: int) -> list[tuple[torch.Tensor, ...]]:
    """Two micro batches per step, each naming its step and place."""
    return [(torch.tensor([step, micro]),) for micro in range(2)]


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "prefetch"]


def test_batches_arrive_in_order_on_the_device(pkg):
    seen = []
    for step, batches in pkg.module("training.prefetch").steps(load_step, range(3, 7), torch.device("cpu")):
        seen += [(step, *batch[0].tolist()) for batch in batches]
    assert seen == [(step, step, micro) for step in range(3, 7) for micro in range(2)]
    assert not prefetch_threads()


def test_leaving_the_loop_stops_the_thread(pkg):
    """A return (preemption) or an exception out of the loop drops the iterator: the thread is joined."""

    def train(fail: bool) -> int:
        for step, batches in pkg.module("training.prefetch").steps(load_step, range(1000), torch.device("cpu")):
            list(batches)
            if step == 3:
                if fail:
                    raise RuntimeError("loss is NaN")
                return step
        return -1

    assert train(fail=False) == 3 and not prefetch_threads()
    with pytest.raises(RuntimeError, match="loss is NaN"):
        train(fail=True)
    assert not prefetch_threads()


def test_a_data_error_in_the_thread_is_raised_at_its_step(pkg):
    config_error = pkg.config.ConfigError
    done = []

    def load(step: int):
        if step == 2:
            raise config_error("data.dir=/data: shard train_0003.bin is truncated; run prepare-data --force")
        return load_step(step)

    with pytest.raises(config_error) as raised:
        for step, batches in pkg.module("training.prefetch").steps(load, range(5), torch.device("cpu")):
            list(batches)
            done.append(step)
    assert done == [0, 1]  # the steps before it ran as usual
    assert str(raised.value) == "data.dir=/data: shard train_0003.bin is truncated; run prepare-data --force"
    assert not prefetch_threads()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinning needs CUDA")
def test_cuda_batches_arrive_on_the_device(pkg):
    device = torch.device("cuda", torch.cuda.current_device())
    for _, batches in pkg.module("training.prefetch").steps(load_step, range(2), device):
        assert all(batch[0].device == device for batch in batches)
    assert not prefetch_threads()
