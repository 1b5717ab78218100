"""Config classes chosen by a ``type`` name, as LeRobot's (draccus') ChoiceRegistry does.

A base class opts in with ``class OptimizerConfig(ChoiceRegistry, choice_base=True)``; its
subclasses register with ``@OptimizerConfig.register_subclass("adamw")``. On disk and on the
command line the choice is the ``type`` key: ``{"type": "adamw", "lr": ...}``,
``--optimizer.type=adamw``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar


class UnknownChoice(ValueError):
    """A name that no class is registered under, nor offered by the base's fallback."""


class ChoiceRegistry:
    type: ClassVar[str]
    # The choice a bare ``--<field>.<key>=...`` flag creates when no ``type`` was given.
    default_choice: ClassVar[str | None] = None
    _choices: ClassVar[dict[str, type]]
    # What the choice is of, for messages: "policy", "optimizer", ...
    choice_kind: ClassVar[str] = ""
    # Where a base finds the classes of names registered nowhere here (LeRobot's own policy
    # types, installed beside us): ``name -> class`` or ValueError saying why there is none;
    # set by the package that provides them.
    choice_fallback: ClassVar[Callable[[str], type] | None] = None

    def __init_subclass__(
        cls, choice_base: bool = False, choice_kind: str = "", **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if choice_base:
            cls._choices = {}
            cls.choice_kind = choice_kind

    @classmethod
    def register_subclass(cls, name: str) -> Callable[[type], type]:
        """Class decorator: register a subclass under ``name`` (its ``type``)."""

        def decorator(subclass: type) -> type:
            registered = cls._choices.get(name)
            if registered is not None and registered is not subclass:
                raise ValueError(f"{name!r} is already registered by {registered.__qualname__}")
            subclass.type = name
            cls._choices[name] = subclass
            return subclass

        return decorator

    @classmethod
    def get_choice_class(cls, name: str) -> type:
        """The class registered as ``name``, else the one the base's fallback offers;
        ValueError saying why there is none (:class:`UnknownChoice` listing the known names when
        nothing knows the name)."""
        registered = cls._choices.get(name)
        if registered is not None:
            return registered
        fallback_error: ValueError | None = None
        if cls.choice_fallback is not None:
            try:
                return cls.choice_fallback(name)
            except UnknownChoice:
                pass
            except ValueError as e:
                fallback_error = e
        why = getattr(cls, "refused_choices", {}).get(name)
        if why is not None:
            raise ValueError(f"{cls.choice_kind} type {name!r} is not built here: {why}")
        if fallback_error is not None:
            raise fallback_error
        raise UnknownChoice(
            f"unknown {cls.choice_kind} type {name!r}; known types: {cls.known_choices()}"
        )

    @classmethod
    def known_choices(cls) -> list[str]:
        return sorted(cls._choices)

    @classmethod
    def is_choice_base(cls) -> bool:
        return "_choices" in cls.__dict__
