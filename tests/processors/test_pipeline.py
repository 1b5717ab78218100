"""The processor step registry: loadable by name, and one class per name."""

from __future__ import annotations

import pytest

from lerobot_pipe.processors import ProcessorStep, register_step
from lerobot_pipe.processors import pipeline as P


@pytest.fixture(autouse=True)
def registry(monkeypatch) -> dict:
    """A copy of the registry for each test, so that its registrations do not leak."""
    copy = dict(P._STEPS)
    monkeypatch.setattr(P, "_STEPS", copy)
    return copy


def test_a_new_name_is_registered(registry):
    @register_step
    class Scale(ProcessorStep):
        registry_name = "test_scale_processor"

    assert registry["test_scale_processor"] is Scale


def test_a_duplicate_name_is_refused(registry):
    """LeRobot's ProcessorStepRegistry raises on a name already registered; so do we, naming
    both classes, and the first registration stays."""
    device_step = registry["device_processor"]

    class MyDevice(ProcessorStep):
        registry_name = "device_processor"

    with pytest.raises(ValueError) as error:
        register_step(MyDevice)
    assert str(error.value) == (
        f"processor step {__name__}.test_a_duplicate_name_is_refused.<locals>.MyDevice: "
        "registry_name 'device_processor' is already registered by "
        f"{device_step.__module__}.{device_step.__qualname__}; give it another registry_name"
    )
    assert registry["device_processor"] is device_step
