"""torchvision's ImageNet weights of the ResNet backbones, by the names LeRobot's configs use.

``--policy.pretrained_backbone_weights`` takes torchvision's weight names
(``ResNet18_Weights.IMAGENET1K_V1``, ``IMAGENET1K_V1``, ``DEFAULT``; null = random init). The
files are torchvision's own, at its published URLs, cached where torchvision caches them:
``torch.hub.get_dir()/checkpoints/<file name>`` ($TORCH_HOME/hub, default ~/.cache/torch/hub), so
a cache filled by torchvision or LeRobot serves us and the reverse. They are fetched and read with
torch's public hub API (``download_url_to_file``, ``load_state_dict_from_url``, weights only).

Before launch, :func:`ensure_backbone_weights` makes sure the file is in the cache (downloading it
on one process per machine) or fails saying why and naming ``=null``.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

log = logging.getLogger(__name__)

_BASE_URL = "https://download.pytorch.org/models/"
# torchvision's weight enums (class name, members) and files; DEFAULT aliases its best member.
_WEIGHTS: dict[str, tuple[str, dict[str, str], str]] = {
    "resnet18": ("ResNet18_Weights", {"IMAGENET1K_V1": "resnet18-f37072fd.pth"}, "IMAGENET1K_V1"),
    "resnet34": ("ResNet34_Weights", {"IMAGENET1K_V1": "resnet34-b627a593.pth"}, "IMAGENET1K_V1"),
    "resnet50": (
        "ResNet50_Weights",
        {"IMAGENET1K_V1": "resnet50-0676ba61.pth", "IMAGENET1K_V2": "resnet50-11ad3fa6.pth"},
        "IMAGENET1K_V2",
    ),
    "resnet101": (
        "ResNet101_Weights",
        {"IMAGENET1K_V1": "resnet101-63fe2227.pth", "IMAGENET1K_V2": "resnet101-cd907fc2.pth"},
        "IMAGENET1K_V2",
    ),
    "resnet152": (
        "ResNet152_Weights",
        {"IMAGENET1K_V1": "resnet152-394f9c45.pth", "IMAGENET1K_V2": "resnet152-f82ba261.pth"},
        "IMAGENET1K_V2",
    ),
}
# Keys of torchvision's classification model that a layer4 feature extractor does not have.
_CLASSIFIER_PREFIX = "fc."
_BN_COUNTER = "num_batches_tracked"
_REACH_TIMEOUT_S = 10.0
_NULL_HINT = (
    "pass --policy.pretrained_backbone_weights=null to start the backbone from random weights"
)
_OFFLINE_TRUE = ("1", "on", "yes", "true")


class BackboneWeightsError(ValueError):
    """The pretrained backbone weights a config names cannot be resolved, found or read."""


def resolve_weights(backbone: str, weights: str) -> str:
    """The URL of torchvision's ``weights`` for ``backbone``; accepts ``<Enum>.<MEMBER>``,
    ``<MEMBER>`` and ``DEFAULT`` as torchvision does."""
    if backbone not in _WEIGHTS:
        raise BackboneWeightsError(
            f"no pretrained weights are known for vision_backbone={backbone!r}; choose one of "
            f"{', '.join(_WEIGHTS)}, or {_NULL_HINT}"
        )
    enum_name, members, default = _WEIGHTS[backbone]
    member = weights.removeprefix(enum_name + ".")
    if member == "DEFAULT":
        member = default
    if member not in members:
        choices = [f"{enum_name}.{m}" for m in members] + [f"{enum_name}.DEFAULT"]
        raise BackboneWeightsError(
            f"pretrained_backbone_weights={weights!r} are not weights of {backbone} (the "
            f"vision_backbone); choose one of {', '.join(choices)}, or {_NULL_HINT}"
        )
    return _BASE_URL + members[member]


def cached_weights_file(url: str) -> Path:
    """Where torch.hub (and so torchvision) caches the file at ``url``."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)


def offline_requested(env: Mapping[str, str]) -> bool:
    """HF_HUB_OFFLINE, the switch LeRobot users set for an offline machine, also stops the
    backbone download."""
    return env.get("HF_HUB_OFFLINE", "").strip().lower() in _OFFLINE_TRUE


def _feature_extractor_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        k: v
        for k, v in state.items()
        if not k.startswith(_CLASSIFIER_PREFIX) and not k.endswith(_BN_COUNTER)
    }


def _check_file(path: Path, backbone: nn.Module, label: str) -> dict[str, torch.Tensor]:
    """The file's feature-extractor tensors; BackboneWeightsError unless they fit ``backbone``."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch.load raises many types for a damaged file
        # The first line only: torch's weights-only message goes on to suggest weights_only=False.
        reason = (str(e).splitlines() or [""])[0][:200]
        raise BackboneWeightsError(
            f"{path} ({label}) cannot be read ({type(e).__name__}: {reason}); delete it to "
            f"download it again, or {_NULL_HINT}"
        ) from None
    if not isinstance(state, dict):
        raise BackboneWeightsError(f"{path} ({label}) does not hold a state dict; delete it")
    state = _feature_extractor_state(state)
    # A trainable batch norm's update counter is not in torchvision's files; loading sets it.
    expected = _feature_extractor_state(backbone.state_dict())
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(expected) & set(state) if state[k].shape != expected[k].shape)
    if missing or unexpected or wrong:
        raise BackboneWeightsError(
            f"{path} does not hold {label}: missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"wrong shapes {wrong[:5]}; delete it to download it again, or {_NULL_HINT}"
        )
    return state


def load_imagenet_weights(backbone: nn.Module, name: str, weights: str) -> None:
    """Load torchvision's ``weights`` for ResNet ``name`` into ``backbone`` (a
    :class:`~lerobot_pipe.policies.vision.resnet.ResNetBackbone`), from the cache or, as
    torchvision does, downloaded into it."""
    url = resolve_weights(name, weights)
    path = cached_weights_file(url)
    if not path.is_file():
        if offline_requested(os.environ):
            raise BackboneWeightsError(
                f"torchvision's ImageNet weights {name} {weights} are not in the cache ({path}) "
                f"and downloads are off (HF_HUB_OFFLINE is set): copy {url} there, or {_NULL_HINT}"
            )
        log.info("downloading %s's ImageNet weights %s from %s to %s", name, weights, url, path)
        torch.hub.load_state_dict_from_url(
            url, map_location="cpu", weights_only=True, check_hash=True
        )
    backbone.load_state_dict(_check_file(path, backbone, f"{name} {weights}"))


def ensure_backbone_weights(
    name: str, weights: str, *, offline: bool, download: bool = True
) -> Path | None:
    """Make sure torchvision's ``weights`` for ResNet ``name`` are in the cache and readable;
    return the file. Without ``download`` (another process on this machine fetches them) a
    missing file returns None. BackboneWeightsError when offline or unreachable."""
    from lerobot_pipe.policies.vision.resnet import resnet_backbone

    url = resolve_weights(name, weights)
    path = cached_weights_file(url)
    label = f"{name} {weights}"
    with torch.device("meta"):
        reference = resnet_backbone(name)
    if path.is_file():
        _check_file(path, reference, label)
        return path
    where = f"torchvision's ImageNet weights {label} are not in the cache ({path})"
    if offline:
        raise BackboneWeightsError(
            f"{where} and downloads are off (HF_HUB_OFFLINE is set): copy {url} there (or set "
            f"TORCH_HOME to a cache that has it), or {_NULL_HINT}"
        )
    if not download:
        return None
    host = urlparse(url).hostname
    try:
        socket.create_connection((host, 443), timeout=_REACH_TIMEOUT_S).close()
    except OSError as e:
        raise BackboneWeightsError(
            f"{where} and {host} cannot be reached ({e}): this machine looks offline; copy {url} "
            f"to {path}, or {_NULL_HINT}"
        ) from None
    log.info("downloading %s from %s to %s", label, url, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    match = torch.hub.HASH_REGEX.search(path.name)
    try:
        torch.hub.download_url_to_file(url, str(path), match.group(1) if match else None)
    except Exception as e:  # noqa: BLE001 - urllib, hash and file errors alike
        raise BackboneWeightsError(
            f"{where} and downloading {url} failed ({type(e).__name__}: {e}); retry, copy the "
            f"file to {path}, or {_NULL_HINT}"
        ) from None
    _check_file(path, reference, label)
    return path
