"""Which submodules' ``forward`` a policy bypasses: the probe behind FSDP2's wrap units.

FSDP2 gathers a unit's parameters in hooks on the unit's ``forward``. A model that calls a
module's children, or its parameters, without calling the module itself (``seq[1:](x)``,
``layer.self_attn(...)`` instead of ``layer(...)``, ``F.linear(x, m.weight)``) leaves such a unit's
parameters sharded where they are used, and the first step fails deep in the model with
``got mixed torch.Tensor and DTensor``. Choosing units by class or by size cannot see this; only
running the model can. :func:`find_bypassed_modules` runs the policy's training forward and its
inference methods once, on one real batch, before the model is sharded, and records every use of
a parameter with the modules that were running at that moment: a module that owns a parameter
used while the module's own forward was not running is *bypassed* and cannot be a unit.

The probe runs on the still unsharded model, with the RNG states, buffers and policy queues
saved and restored around it, so training proceeds exactly as without it: the real model (DDP
is never probed; a sharded run built eagerly), or, in a sharded run, the model built on the
meta device (distributed/meta_init.py) with the batch moved there, values read from meta
tensors (``.item()``, ``bool(t)``) answering 1 (:class:`MetaValues`): a test checks that every
policy's probe finds the same modules on the meta model as on the real one.

A model whose layers are not called as modules can still make them units: it gives each such
module a *unit entry* (:func:`add_unit_entry`, an instance method ``run_as_unit(fn, *args)`` that
calls ``fn(*args)``; no new module, so no parameter name changes) and runs the layer's work
through it. FSDP2 registers the entry as a forward method of the unit
(``register_fsdp_forward_method``: parallelize.py), so it gathers the unit around the call, and
the probe counts the module as running while its entry runs.
"""

from __future__ import annotations

import contextlib
import functools
import random
import types
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Reading a parameter's metadata is no use of its values: a sharded parameter answers it too.
_METADATA = frozenset(
    [
        *(
            getattr(torch.Tensor, name).__get__
            for name in (
                "dtype",
                "device",
                "shape",
                "ndim",
                "requires_grad",
                "is_cuda",
                "layout",
                "is_meta",
                "grad",
                "grad_fn",
                "is_leaf",
            )
        ),
        *(
            getattr(torch.Tensor, name)
            for name in (
                "size",
                "dim",
                "numel",
                "is_floating_point",
                "is_complex",
                "element_size",
                "get_device",
                "is_contiguous",
                "stride",
                "data_ptr",
                "__len__",
            )
        ),
    ]
)


class _ParameterUses(TorchFunctionMode):
    """Records, for each torch call that takes a parameter, the parameter and whether each of
    its owners was running (their forward on the stack)."""

    def __init__(self, owners: dict[int, list[tuple[str, list[nn.Module]]]], active: Counter):
        super().__init__()
        self.owners = owners  # id(param) -> [(its name, the modules on that name's path)]
        self.active = active  # id(module) -> how many of its forwards are running
        self.bypassed: dict[str, str] = {}  # module name -> a parameter used outside its forward

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA:
            return func(*args, **kwargs)
        leaves, _ = tree_flatten((args, kwargs))
        for leaf in leaves:
            if isinstance(leaf, nn.Parameter) and id(leaf) in self.owners:
                self._check(self.owners[id(leaf)])
        return func(*args, **kwargs)

    def _check(self, paths: list[tuple[str, list[tuple[str, nn.Module]]]]) -> None:
        # A tied parameter has several names: the use belongs to the name whose modules run most.
        name, path = max(paths, key=lambda p: sum(self.active[id(m)] > 0 for _, m in p[1]))
        for module_name, module in path:
            if not self.active[id(module)]:
                self.bypassed.setdefault(module_name, name)


def _parameter_owners(model: nn.Module) -> dict[int, list[tuple[str, list[tuple[str, nn.Module]]]]]:
    """Each parameter's names, each with the named submodules along it (the root excluded: the
    root unit gathers through the entry points, see find_bypassed_modules)."""
    modules = dict(model.named_modules(remove_duplicate=False))
    owners: dict[int, list] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        parts = name.split(".")[:-1]
        path = [
            (".".join(parts[:i]), modules[".".join(parts[:i])]) for i in range(1, len(parts) + 1)
        ]
        owners.setdefault(id(param), []).append((name, path))
    return owners


UNIT_ENTRY = "run_as_unit"


def _run_as_unit(self: nn.Module, fn: Callable, *args, **kwargs):
    return fn(*args, **kwargs)


def add_unit_entry(module: nn.Module) -> None:
    """Give ``module`` the unit entry ``module.run_as_unit(fn, *args, **kwargs)``, which returns
    ``fn(*args, **kwargs)``: code that uses the module's parts without calling the module runs
    through it, and the module can be an FSDP2 unit (its entry is a registered forward method).
    An instance attribute that is no module: parameter and state-dict names stay as they are."""
    module.__dict__[UNIT_ENTRY] = types.MethodType(_run_as_unit, module)


def has_unit_entry(module: nn.Module) -> bool:
    return UNIT_ENTRY in module.__dict__


@contextlib.contextmanager
def _track_forwards(model: nn.Module, active: Counter) -> Iterator[None]:
    def enter(module, args):
        active[id(module)] += 1

    def leave(module, args, output):
        active[id(module)] -= 1

    def counted(module: nn.Module, entry: Callable) -> Callable:
        @functools.wraps(entry)
        def run(*args, **kwargs):
            active[id(module)] += 1
            try:
                return entry(*args, **kwargs)
            finally:
                active[id(module)] -= 1

        return run

    handles, entries = [], []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave, always_call=True))
        if has_unit_entry(module):
            entry = module.__dict__[UNIT_ENTRY]
            entries.append((module, entry))
            module.__dict__[UNIT_ENTRY] = counted(module, entry)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module, entry in entries:
            module.__dict__[UNIT_ENTRY] = entry


@contextlib.contextmanager
def _state_untouched(model: nn.Module) -> Iterator[None]:
    """Every RNG (torch's CPU and CUDA, numpy's, Python's), every buffer (batch-norm
    statistics) and every module's train/eval mode (``select_action`` switches to eval) as
    they were before."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    modes = [(m, m.training) for m in model.modules()]
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        for module, training in modes:
            module.training = training


class MetaValues(TorchDispatchMode):
    """On the meta device, for the probe: a value read from a meta tensor (``.item()``,
    ``bool(t)``, ``.tolist()``) answers 1 (``True``) instead of failing, so that a policy whose
    forward asks its inputs a question (transformers' "is this mask all ones?") runs through;
    the probe then follows the path those answers take. The tests compare its result with the
    probe on the real model for every policy."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default and args[0].is_meta:
            dtype = args[0].dtype
            return True if dtype == torch.bool else 1.0 if dtype.is_floating_point else 1
        return func(*args, **kwargs)


def find_bypassed_modules(
    model: nn.Module, *entry_points: Callable[[], object], reset: Callable[[], None] | None = None
) -> dict[str, str]:
    """The submodules of ``model`` whose parameters ``entry_points`` use while the submodule's
    own ``forward`` is not running, each with one such parameter's name, in model order.

    ``entry_points`` call the model (its training forward, ``select_action``, ...) without
    gradients; a module counts as running while its forward or its unit entry
    (:func:`add_unit_entry`) runs; the root itself counts as running throughout (FSDP2's root unit gathers on the
    training forward and on the inference methods registered with it). ``reset`` (the policy's
    ``reset``) empties action queues afterwards. RNGs, buffers and train/eval modes are
    restored.
    """
    active: Counter = Counter()
    uses = _ParameterUses(_parameter_owners(model), active)
    with _state_untouched(model), _track_forwards(model, active), torch.no_grad():
        for entry in entry_points:
            with uses:
                entry()
        if reset is not None:
            reset()
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return dict(sorted(uses.bypassed.items(), key=lambda item: order.get(item[0], len(order))))
