"""Functions and modules compiled by TorchScript, so that they run without Python's GIL.

A V-trace peer computes its loss in a learner thread while the main thread acts, steps the
optimizer and talks to moolib. Every torch call made from Python takes the GIL for its Python
part, and when the other thread holds it, the call waits: a MinAtar minibatch of about 3.3 ms
alone took 5.5 ms in a running peer. A TorchScript function runs its whole body in C++ and lets
go of the GIL meanwhile (docs/results.md, "Where a run's time goes").
"""

import warnings

import torch


def compiled(function):
    """`function` compiled by TorchScript, or `function` itself where torch no longer has
    TorchScript (torch 2.13 calls it deprecated).

    The graph executor's optimizations stay off (process-wide, as torch.jit.optimized_execution
    sets them): the compiled body then calls the same aten ops as Python would, with the same
    autograd, so the results are those of `function` to the last bit. Optimized, TorchScript
    differentiates some ops by its own formulas (torch.min's ties differently) and profiles the
    first calls of every new shape."""
    script = getattr(torch.jit, "script", None)
    if script is None:
        return function
    torch._C._set_graph_executor_optimize(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return script(function)


def traced(module, example_inputs):
    """`module`'s forward pass as torch.jit.trace records it for inputs shaped like
    `example_inputs` (a tuple), sharing the module's parameters; `module` itself where torch has
    no TorchScript. The graph executor's optimizations stay off, as for compiled()."""
    trace = getattr(torch.jit, "trace", None)
    if trace is None or getattr(torch.jit, "script", None) is None:
        return module
    torch._C._set_graph_executor_optimize(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # The shapes are those of this batch: a batch of another shape gets its own trace.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return trace(module, example_inputs, check_trace=False)
