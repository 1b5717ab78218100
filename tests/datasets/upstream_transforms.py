"""Run by LeRobot's own interpreter (not by pytest): torchvision's kernels behind LeRobot's
image transforms, on given frames and parameters, and LeRobot's ImageTransformsConfig defaults.

    <lerobot python> upstream_transforms.py IN.npz OUT.npz DEFAULTS.json

IN.npz: ``frames`` float32 (n, 3, H, W) in [0, 1] and one parameter per frame for each of
``brightness``, ``contrast``, ``saturation``, ``hue``, ``sharpness``, ``angle``, ``dx``, ``dy``.
OUT.npz: the frames after each kernel alone, under the parameter's name (``affine`` for the
rotation by ``angle`` and shift by ``(dx, dy)``).
"""

import dataclasses
import json
import sys

import numpy as np
import torch
from lerobot.transforms import ImageTransformsConfig
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F

KERNELS = {
    "brightness": F.adjust_brightness,
    "contrast": F.adjust_contrast,
    "saturation": F.adjust_saturation,
    "hue": F.adjust_hue,
    "sharpness": F.adjust_sharpness,
}


def main() -> None:
    source, out, defaults = sys.argv[1:4]
    data = np.load(source)
    frames = torch.from_numpy(data["frames"])
    results = {}
    for name, kernel in KERNELS.items():
        results[name] = torch.stack(
            [kernel(frame, float(value)) for frame, value in zip(frames, data[name], strict=True)]
        ).numpy()
    results["affine"] = torch.stack(
        [
            F.affine(
                frame,
                angle=float(angle),
                translate=[int(dx), int(dy)],
                scale=1.0,
                shear=[0.0, 0.0],
                interpolation=InterpolationMode.NEAREST,
                fill=0,
            )
            for frame, angle, dx, dy in zip(
                frames, data["angle"], data["dx"], data["dy"], strict=True
            )
        ]
    ).numpy()
    np.savez(out, **results)
    with open(defaults, "w") as f:
        json.dump(dataclasses.asdict(ImageTransformsConfig()), f)


if __name__ == "__main__":
    main()
