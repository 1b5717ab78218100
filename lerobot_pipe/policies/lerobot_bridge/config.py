"""LeRobot's own policy configs, as configs of ours: the ``--policy.type`` we do not implement
(and any type with ``--policy.implementation=lerobot``) parses into a dataclass generated from
LeRobot's config class of that type, one field per LeRobot field, with LeRobot's defaults as
LeRobot writes them (draccus' encoding): the same flags, the same config.json. The LeRobot
config object itself (:meth:`LeRobotPolicyConfig.upstream`) is decoded from those values by
draccus, as LeRobot decodes a config.json, so LeRobot checks them as it would its own.

Nothing here imports LeRobot until a LeRobot type is asked for.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import importlib.util
import json
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Union

from lerobot_pipe.configs.choice import UnknownChoice
from lerobot_pipe.configs.parser import ConfigError, from_dict, to_dict
from lerobot_pipe.configs.policies import PreTrainedConfig

# The policy types LeRobot 0.6.1 trains (lerobot.policies' registered configs).
LEROBOT_POLICY_TYPES = (
    "act",
    "diffusion",
    "eo1",
    "evo1",
    "fastwam",
    "gaussian_actor",
    "groot",
    "lingbot_va",
    "molmoact2",
    "multi_task_dit",
    "pi0",
    "pi05",
    "pi0_fast",
    "smolvla",
    "tdmpc",
    "vla_jepa",
    "vqbet",
    "wall_x",
    "xvla",
)
INSTALL_HINT = "pip install 'lerobot[training]==0.6.1' (Python >= 3.12) in this venv"
# Fields whose defaults stay ours: LeRobot pushes every trained policy to the Hub by default,
# which fails without --policy.repo_id; we publish only when asked (docs/compatibility.md).
_OUR_DEFAULTS = ("push_to_hub",)


def lerobot_available() -> bool:
    return importlib.util.find_spec("lerobot") is not None


def upstream_base() -> type:
    """LeRobot's PreTrainedConfig, with every policy config it ships registered."""
    import lerobot.policies  # noqa: F401 - registers LeRobot's policy configs
    from lerobot.configs.policies import PreTrainedConfig as UpstreamConfig

    return UpstreamConfig


@functools.cache
def upstream_config_class(policy_type: str) -> type:
    """LeRobot's config class of ``policy_type``: UnknownChoice when LeRobot has no such type,
    ValueError naming the install when LeRobot is not installed."""
    if not lerobot_available():
        if policy_type in LEROBOT_POLICY_TYPES:
            raise ValueError(
                f"{policy_type!r} is LeRobot's policy, not implemented by lerobot_pipe; to train "
                f"LeRobot's own {policy_type} here: {INSTALL_HINT}"
            )
        raise UnknownChoice(policy_type)
    base = upstream_base()
    if policy_type not in base.get_known_choices():
        raise UnknownChoice(policy_type)
    return base.get_choice_class(policy_type)


def _flag_type(tp: Any) -> Any:
    """The type our flag parser reads a LeRobot field of type ``tp`` as: its JSON value, as
    draccus writes it (an enum as its value, a path as a string, a dataclass as an object)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        members = [_flag_type(a) for a in args if a is not type(None)]
        optional = type(None) in args
        if len(members) == 1:
            return members[0] | None if optional else members[0]
        if len({typing.get_origin(m) is list for m in members}) == 2 and len(members) == 2:
            joined = members[0] | members[1]  # e.g. a string or a list of strings
            return joined | None if optional else joined
        return Any
    if tp in (bool, int, float, str):
        return tp
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return str
    if tp is Path or (isinstance(tp, type) and issubclass(tp, Path)):
        return str
    if origin in (list, tuple, set, frozenset):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        items = {_flag_type(a) for a in args}
        if len(items) == 1 and next(iter(items)) in (bool, int, float, str):
            return list[next(iter(items))]
        return list[Any]
    if origin is dict or tp is dict:
        return dict[str, Any]
    if dataclasses.is_dataclass(tp):
        return dict[str, Any]
    return Any


def _encoded_default(f: dataclasses.Field) -> Any:
    import draccus

    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return None
    return json.loads(json.dumps(draccus.encode(value)))


def _field(tp: Any, default: Any, help_text: str) -> Any:
    if isinstance(default, list | dict):
        return dataclasses.field(
            default_factory=lambda v=default: copy.deepcopy(v), metadata={"help": help_text}
        )
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass
class LeRobotPolicyConfig(PreTrainedConfig):
    """A LeRobot policy config, field for field (see :func:`config_class`). ``upstream()`` is
    the LeRobot config these values decode to."""

    upstream_class: ClassVar[type]

    def __post_init__(self) -> None:
        super().__post_init__()
        self.upstream()  # LeRobot's own checks of the values, at parse time

    def upstream(self) -> Any:
        """LeRobot's config object of these values (a new one per call: LeRobot's code may
        change it, e.g. fill its features)."""
        data = to_dict(self)
        data.pop("type")
        return copy.deepcopy(_decoded(self.upstream_class, json.dumps(data, sort_keys=True)))

    def validate_features(self) -> None:
        super().validate_features()
        self.upstream().validate_features()

    @property
    def observation_delta_indices(self) -> list[int] | None:
        return self.upstream().observation_delta_indices

    @property
    def action_delta_indices(self) -> list[int] | None:
        return self.upstream().action_delta_indices

    @property
    def drop_n_last_frames_of_upstream(self) -> int:
        return getattr(self.upstream(), "drop_n_last_frames", 0) or 0

    def get_optimizer_preset(self):
        from lerobot_pipe.configs.optim import OptimizerConfig

        return _ours(OptimizerConfig, self.upstream().get_optimizer_preset(), "optimizer.")

    def get_scheduler_preset(self):
        from lerobot_pipe.configs.optim import SchedulerConfig

        preset = self.upstream().get_scheduler_preset()
        return None if preset is None else _ours(SchedulerConfig, preset, "scheduler.")


def _ours(base: type, upstream_value: Any, prefix: str) -> Any:
    """LeRobot's optimizer or scheduler preset as our config of the same type and values."""
    import draccus

    data = json.loads(json.dumps(draccus.encode(upstream_value)))
    data["type"] = upstream_value.type if hasattr(upstream_value, "type") else data.get("type")
    if data["type"] is None:
        data["type"] = type(upstream_value).get_choice_name(type(upstream_value))
    if data["type"] not in base.known_choices():
        raise ConfigError(
            f"LeRobot's {prefix.rstrip('.')} preset {data['type']!r} is not one this trainer "
            f"runs ({', '.join(base.known_choices())}): pass --use_policy_training_preset=false "
            f"with --{prefix}type=<one of them>"
        )
    return from_dict(base, data, prefix)


@functools.lru_cache(maxsize=64)
def _decoded(upstream_class: type, data_json: str) -> Any:
    import draccus

    try:
        return draccus.decode(upstream_class, json.loads(data_json))
    except Exception as e:  # draccus' parsing errors, LeRobot's __post_init__ checks
        raise ValueError(f"LeRobot's {upstream_class.__name__} refuses these values: {e}") from e


@functools.cache
def config_class(policy_type: str) -> type[LeRobotPolicyConfig]:
    """Our config class for LeRobot's ``policy_type``: each field of LeRobot's class, typed as
    its JSON value, defaulting to LeRobot's default as LeRobot writes it (ours for
    ``push_to_hub``). Its ``type`` is the LeRobot type; it is registered nowhere (so ours stays
    the class of a type we implement)."""
    upstream = upstream_config_class(policy_type)
    hints = typing.get_type_hints(upstream)
    own = {f.name: f for f in dataclasses.fields(PreTrainedConfig)}
    fields = []
    for f in dataclasses.fields(upstream):
        if not f.init:
            continue
        if f.name in _OUR_DEFAULTS:
            continue
        tp = own[f.name].type if f.name in own else _flag_type(hints[f.name])
        if f.name in ("input_features", "output_features", "normalization_mapping"):
            tp = dict
        fields.append((f.name, tp, _field(tp, _encoded_default(f), f"LeRobot's {f.name}")))
    name = "LeRobot" + upstream.__name__
    cls = dataclasses.make_dataclass(
        name, fields, bases=(LeRobotPolicyConfig,), namespace={"upstream_class": upstream}
    )
    cls.__module__ = __name__
    cls.__doc__ = f"LeRobot's {upstream.__module__}.{upstream.__name__}, as flags of ours."
    cls.type = policy_type
    return cls
