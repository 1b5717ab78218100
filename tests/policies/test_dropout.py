"""lerobot_pipe.policies.dropout: nn.Dropout's distribution with a cheaper CPU mask."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lerobot_pipe.policies.dropout import Dropout, dropout

N = 1_000_000


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keeps_each_element_with_probability_1_minus_p_and_scales_it(p, dtype):
    torch.manual_seed(0)
    x = torch.rand(N, dtype=dtype) + 1.0  # no zeros of its own
    y = dropout(x, p)
    kept = y != 0
    # 5 standard deviations of a binomial fraction over N elements
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * (p * (1 - p) / N) ** 0.5
    assert y.dtype == dtype
    torch.testing.assert_close(y[kept], (x[kept].float() / (1 - p)).to(dtype))


def test_its_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(1)
    x = torch.randn(1000, 64, requires_grad=True)
    y = dropout(x, 0.2)
    y.sum().backward()
    mask = (y != 0).float()
    torch.testing.assert_close(x.grad, mask / 0.8)


def test_the_same_generator_state_gives_the_same_mask():
    """Its draws come from torch's generator: seeded runs repeat and an exact resume, which
    restores the generator, continues with the same masks."""
    x = torch.randn(4096)
    torch.manual_seed(7)
    first = dropout(x, 0.1)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.1), first)
    assert not torch.equal(dropout(x, 0.1), first)


def test_off_in_eval_at_p_zero_and_everything_at_p_one():
    x = torch.randn(100)
    module = Dropout(0.3).eval()
    assert module(x) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


def test_inplace_writes_into_its_input():
    torch.manual_seed(2)
    x = torch.ones(1000)
    y = Dropout(0.5, inplace=True)(x)
    assert y.data_ptr() == x.data_ptr() and set(x.unique().tolist()) <= {0.0, 2.0}


def test_act_uses_it_for_every_dropout():
    """Every dropout module of ACT is this one (still an nn.Dropout: no state, the same
    checkpoints); its attention dropout stays inside torch's attention kernel."""
    from lerobot_pipe.policies.act import ACTConfig, ACTPolicy

    config = ACTConfig.tiny(
        input_features={"observation.environment_state": {"type": "ENV", "shape": [3]}},
        output_features={"action": {"type": "ACTION", "shape": [2]}},
    )
    dropouts = [m for m in ACTPolicy(config).modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(type(m) is Dropout for m in dropouts)
