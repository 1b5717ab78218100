"""Processor pipelines in LeRobot's on-disk format, and the step registry they are built from.

A pipeline is an ordered list of steps applied to a batch: a flat dict keyed like a LeRobot batch
(``observation.state``, ``observation.images.<camera>``, ``action``, ``action_is_pad``, ...).
The preprocessor takes an observation (or a training batch) and returns the batch the policy
reads; the postprocessor takes the policy's action tensor and returns it unnormalized.

On disk (LeRobot's ``DataProcessorPipeline.save_pretrained`` layout, so its tools load ours and
we load theirs)::

    <name>.json                               {"name", "steps": [{"registry_name", "config",
                                                                   "state_file"?}, ...]}
    <name>_step_<i>_<registry_name>.safetensors   the state of step i, when it has one

``from_pretrained`` takes LeRobot's ``overrides``: ``{registry_name: {config key: value}}``
merged into a step's saved config before the step is built (e.g. ``{"device_processor":
{"device": "cuda"}}``); an override naming no step of the pipeline is an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

from safetensors.torch import load_file, save_file
from torch import Tensor

from lerobot_pipe.configs.types import ACTION

Batch = dict[str, Any]


class ProcessorError(ValueError):
    """A processor file or override that cannot be used; the message names the file or step."""


class ProcessorStep:
    """One step of a pipeline: a pure function of the batch plus a JSON config and an optional
    tensor state. Subclasses set ``registry_name`` and register with :func:`register_step`."""

    registry_name: ClassVar[str]

    def __call__(self, batch: Batch) -> Batch:
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        """JSON-able keyword arguments that rebuild the step (the ``config`` saved on disk)."""
        return {}

    def state_dict(self) -> dict[str, Tensor]:
        """Tensors saved beside the config; empty for stateless steps."""
        return {}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if state:
            raise ProcessorError(f"{self.registry_name} holds no state, got {sorted(state)}")


_STEPS: dict[str, type[ProcessorStep]] = {}


def register_step(cls: type[ProcessorStep]) -> type[ProcessorStep]:
    """Class decorator: make ``cls`` loadable by its ``registry_name``. A name already taken is
    refused (as LeRobot's ProcessorStepRegistry does): a saved pipeline names its steps only by
    it, so a second class under one name would silently replace the first one when loading."""
    existing = _STEPS.get(cls.registry_name)
    if existing is not None:
        raise ValueError(
            f"processor step {cls.__module__}.{cls.__qualname__}: registry_name "
            f"{cls.registry_name!r} is already registered by "
            f"{existing.__module__}.{existing.__qualname__}; give it another registry_name"
        )
    _STEPS[cls.registry_name] = cls
    return cls


def _action_in(data: Tensor | Batch) -> Batch:
    return {ACTION: data} if isinstance(data, Tensor) else dict(data)


def _action_out(batch: Batch) -> Tensor:
    return batch[ACTION]


class PolicyProcessorPipeline:
    """An ordered list of steps with a name (the file stem it is saved under).

    ``to_batch`` / ``to_output`` convert what the caller passes and gets back: the identity on
    dicts for a preprocessor; a bare action tensor for a postprocessor (``for_actions=True``).
    """

    def __init__(self, steps: list[ProcessorStep], name: str, *, for_actions: bool = False):
        self.steps = list(steps)
        self.name = name
        self.for_actions = for_actions
        self._to_batch: Callable[[Any], Batch] = _action_in if for_actions else dict
        self._to_output: Callable[[Batch], Any] = _action_out if for_actions else dict

    def __call__(self, data: Any) -> Any:
        batch = self._to_batch(data)
        for step in self.steps:
            batch = step(batch)
        return self._to_output(batch)

    def __len__(self) -> int:
        return len(self.steps)

    def step(self, registry_name: str) -> ProcessorStep:
        """The (first) step registered as ``registry_name``."""
        for step in self.steps:
            if step.registry_name == registry_name:
                return step
        raise KeyError(
            f"pipeline {self.name!r} has no {registry_name!r} step; it has "
            f"{[s.registry_name for s in self.steps]}"
        )

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``<name>.json`` and one state file per step that has state."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        entries = []
        for i, step in enumerate(self.steps):
            entry: dict[str, Any] = {
                "registry_name": step.registry_name,
                "config": step.get_config(),
            }
            state = step.state_dict()
            if state:
                state_file = f"{self.name}_step_{i}_{step.registry_name}.safetensors"
                tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
                save_file(tensors, str(directory / state_file))
                entry["state_file"] = state_file
            entries.append(entry)
        text = json.dumps({"name": self.name, "steps": entries}, indent=2)
        (directory / f"{self.name}.json").write_text(text + "\n")

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        config_filename: str,
        *,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        for_actions: bool = False,
    ) -> Self:
        """Load a pipeline saved by :meth:`save_pretrained` or by LeRobot."""
        path = Path(directory) / config_filename
        if not path.is_file():
            raise FileNotFoundError(f"processor file {path} not found")
        try:
            saved = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ProcessorError(f"{path} is not valid JSON (line {e.lineno}: {e.msg})") from None
        if not isinstance(saved, dict) or not isinstance(saved.get("steps"), list):
            raise ProcessorError(f"{path} must hold {{'name', 'steps': [...]}}")
        overrides = {k: dict(v) for k, v in (overrides or {}).items()}
        names = [entry.get("registry_name") for entry in saved["steps"]]
        unused = sorted(set(overrides) - set(names))
        if unused:
            raise ProcessorError(
                f"overrides for {unused} match no step of {path} (its steps: {names})"
            )
        steps = [cls._build_step(path, entry, overrides) for entry in saved["steps"]]
        return cls(steps, saved.get("name") or path.stem, for_actions=for_actions)

    @staticmethod
    def _build_step(
        path: Path, entry: dict[str, Any], overrides: dict[str, dict[str, Any]]
    ) -> ProcessorStep:
        name = entry.get("registry_name")
        # A policy's own steps register when its package is imported (lerobot_pipe.policies).
        step_cls = _STEPS.get(name)
        if step_cls is None:
            raise ProcessorError(
                f"{path}: processor step {name!r} is not supported here (supported: "
                f"{sorted(_STEPS)}); this pipeline was written for a policy lerobot_pipe "
                "does not implement"
            )
        config = {**entry.get("config", {}), **overrides.get(name, {})}
        try:
            step = step_cls(**config)
        except TypeError as e:
            raise ProcessorError(f"{path}: bad config for step {name!r}: {e}") from None
        state_file = entry.get("state_file")
        if state_file is not None:
            state_path = path.parent / state_file
            if not state_path.is_file():
                raise FileNotFoundError(
                    f"processor state file {state_path} (named in {path}) not found"
                )
            step.load_state_dict(load_file(str(state_path)))
        return step
