"""Build a policy on the meta device and materialize only each rank's shards, with exactly the
values the eager build gives (issue #20 item 7: no rank ever holds the full fp32 model).

:class:`MetaBuild` runs the build (the policy's constructor, PEFT's adapters) with tensors
created on the meta device and records every ATen call that touches a meta tensor: what it
writes, what it reads, its arguments (real tensors among them kept: a grid from numpy, an
ImageNet backbone's weights). Meta tensors hold no values and draw no random numbers, so the
build costs no memory and leaves the RNG where it was.

:meth:`DeferredInit.materialize` replays that record on the CPU after ``fully_shard`` and
``to_empty``, in the recorded order, with a generator started from the default generator's state
at the start of the build: every random call draws what it drew in the eager build. It runs
only the calls that the final values depend on (an initialization that a later one overwrites
whole is dead), but every random call, dead ones on a scratch tensor of the same shape and
strides (so the generator advances as in the eager build). A tensor's full value exists from the
call that last overwrites it whole until its last use; then each parameter's shard (this rank's
rows, as FSDP2 places them) is copied into its DTensor and the full tensor freed. The peak is
therefore the shards plus the largest tensors being initialized at once, not the model. Buffers
(persistent and not) are replayed whole. Weights from a checkpoint (``--policy.path``) are not
replayed but read shard by shard from its safetensors file (:func:`safetensors_source`). At the
end the default generator is set to the state the eager build leaves it in.

What a record cannot reproduce is refused while building (:class:`Unsupported`), and the trainer
then builds eagerly and logs why: a random call on a real tensor (its draws would come from a
different generator position), a call with its own generator, a storage viewed with two dtypes.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils._device import DeviceContext
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

META = torch.device("meta")
CPU = torch.device("cpu")
# Calls whose result is the same whatever the tensor held before (with a whole-storage
# destination, earlier writes to it are dead).
_OVERWRITES = frozenset(
    f"aten::{name}"
    for name in (
        "uniform_",
        "normal_",
        "fill_",
        "zero_",
        "random_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
        "bernoulli_",
        "copy_",
    )
)
# Tensors built from Python data stay real (their values are no function of the RNG).
_REAL_CONSTRUCTORS = frozenset([torch.tensor, torch.as_tensor, torch.asarray])


class Unsupported(Exception):
    """The build does something a record cannot replay exactly; the message says what."""


@dataclass(frozen=True)
class _Ref:
    """A meta tensor as a view of a recorded storage."""

    key: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype

    def whole(self, numel: int) -> bool:
        """Covers every element of its storage once (``numel`` elements of ``dtype``)."""
        if self.offset or math.prod(self.size) != numel:
            return False
        dims = sorted((st, sz) for st, sz in zip(self.stride, self.size, strict=True) if sz > 1)
        expected = 1
        for st, sz in dims:
            if st != expected:
                return False
            expected *= sz
        return True


@dataclass
class _Call:
    func: object
    args: tuple
    kwargs: dict
    random: bool
    writes: list[int]  # storages written (outputs created here, mutated arguments)
    overwrites: set[int]  # those written whole, the call's result not depending on them
    reads: set[int]  # storages whose values the call reads
    created: list[tuple[int, int]] = field(default_factory=list)  # (output index, storage)
    # Recorded under MetaBuild.undrawn(): the eager build draws nothing here (its values are
    # loaded over it); never replayed, and an error if a value depended on it.
    undrawn: bool = False


class _MetaDevice(DeviceContext):
    """``torch.device("meta")`` except for tensors built from data (kept real)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _REAL_CONSTRUCTORS:
            return func(*args, **(kwargs or {}))
        return super().__torch_function__(func, types, args, kwargs)


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[_Call] = []
        self.storages: dict[int, tuple[int, torch.dtype]] = {}  # key -> (numel, dtype)
        self._alive: list[Tensor] = []  # keeps recorded storages (and so their keys) alive
        self.drawing = True  # False under MetaBuild.undrawn()

    def ref(self, t: Tensor) -> _Ref:
        storage = t.untyped_storage()
        key = storage._cdata
        known = self.storages.get(key)
        if known is None:
            self.storages[key] = (storage.nbytes() // t.element_size(), t.dtype)
            self._alive.append(t)
        elif known[1] != t.dtype:
            raise Unsupported(f"a storage viewed as {known[1]} and {t.dtype}")
        return _Ref(key, tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        seen_before = set(self.storages)
        metas = [x for x in tree_flatten((args, kwargs))[0] if _is_meta(x)]
        random = torch.Tag.nondeterministic_seeded in func.tags
        if random and kwargs.get("generator") is not None:
            raise Unsupported(f"{func} with its own generator")
        out = func(*args, **kwargs)
        outs = tree_flatten(out)[0]
        out_metas = [x for x in outs if _is_meta(x)]
        if random and any(
            isinstance(x, Tensor) and not _is_meta(x) for x in tree_flatten((args, kwargs, out))[0]
        ):
            raise Unsupported(f"{func} draws random numbers into a real tensor")
        if not metas and not out_metas:
            return out
        schema = func._schema
        mutated = set()
        for i, arg in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            if arg.alias_info is not None and arg.alias_info.is_write and _is_meta(value):
                mutated.add(value.untyped_storage()._cdata)
        created = [
            (i, x.untyped_storage()._cdata)
            for i, x in enumerate(outs)
            if _is_meta(x) and x.untyped_storage()._cdata not in seen_before
        ]
        if not mutated and not created:
            return out  # a view, or metadata: no values change
        ref_args = tree_map(lambda x: self.ref(x) if _is_meta(x) else x, (args, kwargs))
        for x in out_metas:
            self.ref(x)
        read = {r.key for r in tree_flatten(ref_args)[0] if isinstance(r, _Ref)}
        overwrites = set()
        if schema.name in _OVERWRITES and args and _is_meta(args[0]):
            first = self.ref(args[0])
            if first.whole(self.storages[first.key][0]):
                overwrites.add(first.key)
                if not any(
                    isinstance(r, _Ref) and r.key == first.key
                    for r in tree_flatten((ref_args[0][1:], ref_args[1]))[0]
                ):
                    read.discard(first.key)
        for _, key in created:
            overwrites.add(key)
        self.calls.append(
            _Call(
                func,
                ref_args[0],
                ref_args[1],
                random,
                writes=sorted(mutated | {k for _, k in created}),
                overwrites=overwrites,
                reads=read,
                created=created,
                undrawn=random and not self.drawing,
            )
        )
        return out


def _is_meta(x) -> bool:
    return isinstance(x, Tensor) and x.device.type == "meta"


def _to_cpu_arg(x):
    return CPU if isinstance(x, torch.device) and x.type == "meta" else x


@dataclass
class DeferredInit:
    """The record of a meta build and what each parameter and buffer name refers to."""

    recorder: _Recorder
    generator_state: Tensor
    targets: dict[str, _Ref]  # meta parameters and buffers by name (tied names each)
    real: dict[str, Tensor]  # parameters and buffers that were built real, by name
    # _loose_tensors: (owner, attribute, the real tensor or the record of a meta one)
    loose: list[tuple[object, str, Tensor | _Ref]] = field(default_factory=list)
    peak_bytes: int = 0  # after materialize: the most bytes of whole tensors held at once

    def materialize(
        self,
        model: nn.Module,
        device: torch.device,
        load: Callable[[str, Tensor, Callable[[Tensor], tuple]], bool] | None = None,
    ) -> None:
        """``model`` (sharded or not, the names recorded) on ``device`` with the eager build's
        values. ``load(name, destination, local_index)`` may fill a destination from a checkpoint
        instead (returns whether it did); ``local_index(global_shape)`` gives the index of this
        rank's part."""
        model.to_empty(device=device)
        dests = destinations(model)
        missing = sorted((set(self.targets) | set(self.real)) - set(dests))
        if missing:
            raise RuntimeError(f"meta build: the model lost {missing[:5]}")
        needed: dict[int, list[tuple[str, _Ref, Callable[[Tensor], None]]]] = {}
        with torch.no_grad():
            for name, dest in dests.items():
                if load is not None and load(name, dest, functools.partial(_local_index, dest)):
                    continue
                if name in self.real:
                    _write(dest, self.real[name])
                elif name in self.targets:
                    ref = self.targets[name]
                    write = functools.partial(_write, dest)
                    needed.setdefault(ref.key, []).append((name, ref, write))
                else:
                    raise RuntimeError(f"meta build: {name} was not recorded")
            for owner, attr, value in self.loose:  # on the CPU, where the eager build has them
                if isinstance(value, Tensor):
                    setattr(owner, attr, value)
                else:
                    write = functools.partial(_set_whole, owner, attr)
                    needed.setdefault(value.key, []).append((attr, value, write))
            generator = torch.Generator(device="cpu")
            generator.set_state(self.generator_state)
            self._replay(generator, needed)
        torch.default_generator.set_state(generator.get_state())

    def _replay(self, generator, needed: dict) -> None:
        calls, storages = self.recorder.calls, self.recorder.storages
        # Backward: which calls the needed storages depend on.
        live_keys, live = set(needed), [False] * len(calls)
        for i in range(len(calls) - 1, -1, -1):
            call = calls[i]
            if not live_keys.intersection(call.writes):
                continue
            live[i] = True
            live_keys -= call.overwrites
            live_keys |= call.reads
        if live_keys:  # read before anything wrote them: cannot happen for recorded storages
            raise RuntimeError("meta build: values used before they were made")
        undrawn = [i for i, call in enumerate(calls) if live[i] and call.undrawn]
        if undrawn:
            raise RuntimeError(
                "meta build: a value depends on an initialization the eager build does not draw "
                f"(a weight its file lacks?): {calls[undrawn[0]].func}"
            )
        last_use: dict[int, int] = {}
        for i, call in enumerate(calls):
            if live[i]:
                for key in (*call.writes, *call.reads):
                    last_use[key] = i
        values: dict[int, Tensor] = {}

        def view(ref: _Ref) -> Tensor:
            base = values.get(ref.key)
            if base is None:
                numel, dtype = storages[ref.key]
                base = values[ref.key] = torch.empty(numel, dtype=dtype)
            return base.as_strided(ref.size, ref.stride, ref.offset)

        def scratch(ref: _Ref) -> Tensor:
            return torch.empty_strided(ref.size, ref.stride, dtype=ref.dtype)

        for i, call in enumerate(calls):
            if not (live[i] or call.random) or call.undrawn:
                continue
            resolve = view if live[i] else scratch
            args, kwargs = tree_map(functools.partial(_resolve, resolve), (call.args, call.kwargs))
            if call.random:
                kwargs["generator"] = generator
            out = call.func(*args, **kwargs)
            if not live[i]:
                continue
            outs = tree_flatten(out)[0]
            for index, key in call.created:
                values[key] = outs[index].as_strided((storages[key][0],), (1,), 0)
            held = sum(v.numel() * v.element_size() for v in values.values())
            self.peak_bytes = max(self.peak_bytes, held)
            for key in (*call.writes, *call.reads):
                if last_use.get(key) == i:
                    for _, ref, write in needed.pop(key, []):
                        write(view(ref))
                    values.pop(key, None)
        if needed:
            names = [n for entries in needed.values() for n, _, _ in entries]
            raise RuntimeError(f"meta build: no recorded values for {names[:5]}")


def destinations(model: nn.Module) -> dict[str, Tensor]:
    found = dict(model.named_parameters(remove_duplicate=False))
    found |= dict(model.named_buffers(remove_duplicate=False))
    return found


def _local_index(dest: Tensor, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The index of this rank's part of a tensor of ``shape`` placed as ``dest`` is."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(dest, DTensor):
        return tuple(slice(0, n) for n in shape)
    local_shape, offset = compute_local_shape_and_global_offset(
        torch.Size(shape), dest.device_mesh, dest.placements
    )
    return tuple(slice(o, o + n) for o, n in zip(offset, local_shape, strict=True))


def _resolve(resolve: Callable[[_Ref], Tensor], x):
    return resolve(x) if isinstance(x, _Ref) else _to_cpu_arg(x)


def _set_whole(owner: object, attr: str, full: Tensor) -> None:
    setattr(owner, attr, full.clone())


def _loose_tensors(model: nn.Module) -> list[tuple[object, str, Tensor]]:
    """Tensors held as plain attributes, of a module or of an object it holds (a noise
    scheduler's ``alphas_cumprod``): neither parameters nor buffers, still part of the build
    (and put back as built: the probe on the meta device may have moved them there).
    Unsupported when a meta one sits in a container (a list or dict of tensors)."""
    found, seen = [], set()

    def visit(owner: object, depth: int) -> None:
        if id(owner) in seen or depth > 2:
            return
        seen.add(id(owner))
        attrs = vars(owner) if hasattr(owner, "__dict__") else {}
        for attr, value in attrs.items():
            if attr in ("_parameters", "_buffers", "_modules") or isinstance(value, nn.Module):
                continue
            if isinstance(value, Tensor):
                found.append((owner, attr, value))
            elif isinstance(value, (list, tuple, dict)):
                items = value.values() if isinstance(value, dict) else value
                if any(_is_meta(v) for v in items):
                    raise Unsupported(
                        f"meta tensors in a container ({type(owner).__name__}.{attr})"
                    )
            elif hasattr(value, "__dict__") and not isinstance(value, type):
                visit(value, depth + 1)

    for module in model.modules():
        visit(module, 0)
    return found


def _write(dest: Tensor, full: Tensor) -> None:
    """``full`` (the whole tensor) into ``dest``: its local part when ``dest`` is sharded."""
    from torch.distributed.tensor import DTensor

    if tuple(full.shape) != tuple(dest.shape):
        raise RuntimeError(f"meta build: shape {tuple(full.shape)} for {tuple(dest.shape)}")
    if isinstance(dest, DTensor):
        dest.to_local().copy_(full[_local_index(dest, tuple(full.shape))])
    else:
        dest.copy_(full)


_ACTIVE: MetaBuild | None = None


def active_build() -> MetaBuild | None:
    """The MetaBuild whose ``recording()`` is running (a constructor asks: build from a config
    and record where its weights will be read from, instead of reading them now), or None."""
    return _ACTIVE


class MetaBuild:
    """Records a build on the meta device: ``with build.recording(): model = make(...)``
    (entered again for later parts, PEFT's adapters; code between runs as usual), then
    ``build.finish(model)``."""

    def __init__(self) -> None:
        self._state = torch.default_generator.get_state()  # where the eager build would start
        self._recorder = _Recorder()

    @contextlib.contextmanager
    def recording(self) -> Iterator[MetaBuild]:
        global _ACTIVE
        outer, _ACTIVE = _ACTIVE, self
        try:
            with _MetaDevice(META), self._recorder:
                yield self
        finally:
            _ACTIVE = outer

    @contextlib.contextmanager
    def undrawn(self) -> Iterator[None]:
        """A part whose eager build draws no random numbers because it loads its weights (a
        pretrained module's ``from_pretrained``), built here from its config: its random
        initializations are recorded but never replayed, so the generator advances as in the
        eager build; every value of the part must then come from a ``load`` source."""
        self._recorder.drawing, before = False, self._recorder.drawing
        try:
            yield
        finally:
            self._recorder.drawing = before

    def refs(self, tensors: dict[str, Tensor]) -> dict[str, _Ref]:
        """The recorded views behind the meta tensors among ``tensors``."""
        return {name: self._recorder.ref(t) for name, t in tensors.items() if _is_meta(t)}

    def finish(self, model: nn.Module) -> DeferredInit:
        everything = destinations(model)
        real = {name: t.detach() for name, t in everything.items() if not _is_meta(t)}
        loose = [
            (owner, attr, self._recorder.ref(t) if _is_meta(t) else t)
            for owner, attr, t in _loose_tensors(model)
        ]
        return DeferredInit(self._recorder, self._state, self.refs(everything), real, loose)


# safetensors' dtype names (its format spec) -> torch dtypes.
_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


class _RowReader:
    """Reads parts of the tensors of a safetensors file with plain ``pread`` calls: the rows
    ``index[0]`` of a tensor (one contiguous byte range), then the rest of ``index`` in memory.
    Not through a memory map (``safe_open``): the pages a map touches count in the process's
    resident memory until it is closed, which is the whole of this rank's share of the file
    on top of the shards it fills."""

    def __init__(self, path: Path) -> None:
        import json
        import os
        import struct

        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(self._fd).st_size
            (length,) = struct.unpack("<Q", os.pread(self._fd, 8, 0).ljust(8, b"\xff"))
            if length > size - 8:
                raise RuntimeError(f"cannot load {path}: not a safetensors file (header size)")
            header = json.loads(os.pread(self._fd, length, 8))
        except BaseException:
            self.close()
            raise
        header.pop("__metadata__", None)
        self._data = 8 + length
        self.entries = header

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.entries[key]["shape"])

    def read(self, key: str, index: tuple[slice, ...]) -> Tensor:
        import os

        entry = self.entries[key]
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise RuntimeError(f"cannot load {self.path}: {key} has dtype {entry['dtype']}")
        shape = tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        row_elems = math.prod(shape[1:]) if shape else 1
        first, stop = (index[0].start, index[0].stop) if shape else (0, 1)
        row_bytes = row_elems * torch.empty((), dtype=dtype).element_size()
        if end - begin != (shape[0] if shape else 1) * row_bytes:
            raise RuntimeError(f"cannot load {self.path}: {key}'s byte range does not match")
        out = torch.empty(((stop - first) * row_elems,), dtype=dtype)
        view, offset = memoryview(out.view(torch.uint8).numpy()), 0
        while offset < len(view):  # pread may return less than asked
            at = self._data + begin + first * row_bytes + offset
            got = os.preadv(self._fd, [view[offset:]], at)
            if got <= 0:
                raise RuntimeError(f"cannot load {self.path}: {key} is truncated")
            offset += got
        if not shape:
            return out.reshape(())
        part = out.view((stop - first, *shape[1:]))
        return part[(slice(None), *index[1:])] if len(index) > 1 else part

    def close(self) -> None:
        import os

        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def safetensors_source(
    model_file: Path | dict[str, Path], names: dict[str, str]
) -> Callable[[str, Tensor, Callable], bool]:
    """A ``load`` for :meth:`DeferredInit.materialize`: each destination in ``names`` (model
    name -> key in the file) read as this rank's part only (the rows it holds, read from the
    file without the rest, :class:`_RowReader`). ``model_file`` is one file or, for a model
    saved in shards, each key's file (``model.safetensors.index.json``'s ``weight_map``).
    The keys read are collected in the function's ``loaded``."""
    from torch.distributed.tensor import DTensor

    readers: dict[Path, _RowReader] = {}

    def reader_of(key: str) -> _RowReader:
        path = Path(model_file if isinstance(model_file, (str, Path)) else model_file[key])
        if path not in readers:
            readers[path] = _RowReader(path)
        return readers[path]

    def load(name: str, dest: Tensor, local_index: Callable) -> bool:
        key = names.get(name)
        if key is None:
            return False
        reader = reader_of(key)
        shape = reader.shape(key)
        if shape != tuple(dest.shape):
            raise RuntimeError(
                f"cannot load {reader.path}: {key} has shape {list(shape)}, the model's "
                f"{name} {list(dest.shape)}"
            )
        values = reader.read(key, local_index(shape))
        local = dest.to_local() if isinstance(dest, DTensor) else dest
        local.copy_(values)
        load.loaded.add(key)
        return True

    def close() -> None:
        for reader in readers.values():
            reader.close()

    load.loaded = set()
    load.close = close
    return load
