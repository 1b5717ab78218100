"""ResNet-18 forward + backward on NCHW vs channels-last camera batches: which layout the loader
should hand the policy, on this device.

    .venv/bin/python bench/bench_memory_format.py [--batch 8 16] [--size 96] [--reps 5]
    .venv/bin/python bench/bench_memory_format.py --device cuda   # bf16 autocast, cuDNN

Variants, the backbone ACT builds (``resnet_backbone``, FrozenBatchNorm, random weights):
  nchw        contiguous NCHW input, NCHW weights (what LeRobot's loader hands its policy);
  cl-input    channels-last input, NCHW weights (what our loader handed the policy from
              torchcodec before issue 19: a permuted view of the decoder's NHWC frames);
  cl-both     channels-last input and weights (``model.to(memory_format=channels_last)``, the
              layout cuDNN's tensor-core kernels prefer; only worth choosing if it wins here).
Runs rotate the variants ``--reps`` times; medians of each run's median step are reported, with
each variant's time relative to ``nchw``. On CPU one intra-op thread (``_common``), fp32; on CUDA
bf16 autocast with ``cudnn.benchmark``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import _common as c  # must come first: pins threads, sets sys.path

# isort: split
import torch

from lerobot_pipe.policies.vision.resnet import resnet_backbone

VARIANTS = ("nchw", "cl-input", "cl-both")


def step_time(net, x: torch.Tensor, device: torch.device, iters: int) -> float:
    """Median seconds of one forward + backward of ``net`` on ``x`` (after one warm-up)."""
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    times = []
    for _ in range(iters + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast:
            y = net(x)
        y.float().mean().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        for p in net.parameters():
            p.grad = None
    return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    nets = {
        "nchw": resnet_backbone("resnet18", False).to(device),
    }
    nets["cl-input"] = nets["nchw"]
    nets["cl-both"] = (
        resnet_backbone("resnet18", False).to(device).to(memory_format=torch.channels_last)
    )
    nets["cl-both"].load_state_dict(nets["nchw"].state_dict())
    print(
        f"ResNet-18 backbone forward + backward, {args.size}x{args.size}, device {device}, "
        f"{'bf16 autocast' if device.type == 'cuda' else 'fp32'}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s); {c.machine_load()}"
    )
    print(f"{'batch':>5}  " + "  ".join(f"{v:>16}" for v in VARIANTS))
    for batch in args.batch:
        x = torch.rand(batch, 3, args.size, args.size, device=device)
        inputs = {"nchw": x, "cl-input": x.contiguous(memory_format=torch.channels_last)}
        inputs["cl-both"] = inputs["cl-input"]
        runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for rep in range(args.reps):
            for v in VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]:
                runs[v].append(step_time(nets[v], inputs[v], device, args.iters))
        med = {v: c.median(runs[v]) for v in VARIANTS}
        print(
            f"{batch:5d}  "
            + "  ".join(f"{1e3 * med[v]:7.1f} ms {med[v] / med['nchw']:5.3f}x" for v in VARIANTS)
        )


if __name__ == "__main__":
    main()
