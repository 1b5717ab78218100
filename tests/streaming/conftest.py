from conftest_hub import hub_server_module  # noqa: F401 - fixture
from stream_data import camera_root, hub_repo  # noqa: F401 - fixtures
