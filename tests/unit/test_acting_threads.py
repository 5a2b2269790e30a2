"""acting_threads: acting's forward passes in the main thread may use fewer torch intra-op threads
than the learner's thread, whose count (torch_threads) stays what it was when it was made."""

from types import SimpleNamespace

import torch
from helpers import linear_learner_state

from examples.vtrace.learner import AsyncLearner

FLAGS = SimpleNamespace(seed=0, batch_size=1, learner_minibatches=1, virtual_batch_size=1)


def test_learner_thread_keeps_its_threads_when_acting_takes_fewer():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        learner = AsyncLearner(FLAGS, linear_learner_state().model)
        torch.set_num_threads(1)  # as train() does with acting_threads=1
        assert torch.get_num_threads() == 1
        assert learner.thread.submit(torch.get_num_threads).result(timeout=30) == 2
        learner.close()
    finally:
        torch.set_num_threads(before)
