"""The value checks every config section's ``validate()`` uses: one message shape for each kind
of mistake, naming the flag as the user types it."""

from __future__ import annotations

from lerobot_pipe.configs.parser import ConfigError


def positive(name: str, value: int | float) -> None:
    if value <= 0:
        raise ConfigError(f"--{name}={value}: must be > 0")


def non_negative(name: str, value: int | float, meaning: str = "") -> None:
    """``meaning`` says what 0 does, e.g. "0 never evaluates"."""
    if value < 0:
        raise ConfigError(f"--{name}={value}: must be >= 0{f' ({meaning})' if meaning else ''}")


def choice(name: str, value: object, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"--{name}={value!r}: choose one of {', '.join(map(str, choices))}")
