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


def test_learner_thread_flushes_subnormal_floats_to_zero():
    """Subnormal floats (below 1.2e-38) cost x86 cores about a hundred times the time of others
    (Adam's second moments decay into them): the learner's thread computes them as zero, even
    when the thread that made the learner does not."""
    subnormal = torch.tensor([1e-39])
    assert (subnormal * 1.0).item() != 0.0  # this thread keeps them
    learner = AsyncLearner(FLAGS, linear_learner_state().model)
    try:
        product = learner.thread.submit(lambda: (subnormal * 1.0).item()).result(timeout=30)
    finally:
        learner.close()
    assert product == 0.0


def test_the_experiment_flushes_subnormal_floats_in_its_main_thread(tmp_path):
    """The optimizer steps in the main thread, which prepare() sets up."""
    from hydra import compose, initialize_config_dir

    from examples.vtrace.config import CONFIG_DIR
    from examples.vtrace.experiment import prepare

    overrides = [f"savedir={tmp_path}/save", f"localdir={tmp_path}/local", "local_name=a"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        flags = compose(config_name="config", overrides=overrides)
    threads = torch.get_num_threads()
    try:
        prepare(flags)
        assert (torch.tensor([1e-39]) * 1.0).item() == 0.0
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
