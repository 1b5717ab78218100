"""Dataset repos: what training-from-a-dataset-repo relies on."""

import json
import random

import pytest
from conftest_hub import hub_snapshot, local_files
from huggingface_hub import HfApi, snapshot_download

from lerobot_pipe.hub import publish_folder

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")

DATASET = "alice/pusht-mini"


@pytest.fixture
def dataset_dir(tmp_path):
    rng = random.Random(0)
    root = tmp_path / "pusht-mini"
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    (root / "data" / "chunk-000").mkdir(parents=True)
    (root / "videos" / "observation.image" / "chunk-000").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps({"codebase_version": "v3.0", "fps": 10}))
    (root / "meta" / "stats.json").write_text(json.dumps({"action": {"mean": [0.0]}}))
    (root / "meta" / "tasks.parquet").write_bytes(rng.randbytes(300))
    (root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").write_bytes(rng.randbytes(900))
    (root / "data" / "chunk-000" / "file-000.parquet").write_bytes(rng.randbytes(6000))
    video = root / "videos" / "observation.image" / "chunk-000" / "file-000.mp4"
    video.write_bytes(rng.randbytes(3000))
    return root


def test_upload_folder_then_snapshot_download(small_lfs_hub, dataset_dir, tmp_path):
    server = small_lfs_hub
    api = HfApi(endpoint=server.url, token=server.token)
    url = api.create_repo(DATASET, repo_type="dataset")
    assert url.repo_type == "dataset" and url.repo_id == DATASET
    api.upload_folder(repo_id=DATASET, repo_type="dataset", folder_path=dataset_dir)
    assert server.file_info(DATASET, "data/chunk-000/file-000.parquet", "dataset")["lfs"]

    path = snapshot_download(
        DATASET,
        repo_type="dataset",
        local_dir=tmp_path / "dl",
        endpoint=server.url,
        token=server.token,
        cache_dir=server.cache_dir,
    )
    got = local_files(path)
    got.pop(".gitattributes")
    assert got == local_files(dataset_dir)
    # A model repo of the same name does not exist.
    assert not server.repo_exists(DATASET, "model")


def test_publish_folder_dataset_and_anonymous_read(small_lfs_hub, dataset_dir, tmp_path):
    server = small_lfs_hub
    receipt = publish_folder(
        dataset_dir,
        DATASET,
        repo_type="dataset",
        allow_patterns=["*.json", "*.parquet", "*.mp4"],
        token=server.token,
        endpoint=server.url,
    )
    assert receipt.repo_type == "dataset"
    assert receipt.commit_url.endswith(f"/datasets/{DATASET}/commit/{receipt.commit_id}")
    # Public dataset: downloadable without a token, only what was asked for.
    path = snapshot_download(
        DATASET,
        repo_type="dataset",
        local_dir=tmp_path / "meta-only",
        endpoint=server.url,
        token=False,
        cache_dir=server.cache_dir,
        allow_patterns=["meta/*"],
    )
    assert set(local_files(path)) == {
        "meta/info.json",
        "meta/stats.json",
        "meta/tasks.parquet",
        "meta/episodes/chunk-000/file-000.parquet",
    }


def test_private_dataset_needs_a_token(small_lfs_hub, dataset_dir, tmp_path):
    server = small_lfs_hub
    publish_folder(
        dataset_dir,
        DATASET,
        repo_type="dataset",
        private=True,
        allow_patterns=["*.json"],
        token=server.token,
        endpoint=server.url,
    )
    got = hub_snapshot(
        server, DATASET, tmp_path / "ok", repo_type="dataset", token=server.read_token
    )
    assert (got / "meta" / "info.json").is_file()
    from huggingface_hub.errors import RepositoryNotFoundError

    with pytest.raises(RepositoryNotFoundError):
        snapshot_download(
            DATASET,
            repo_type="dataset",
            local_dir=tmp_path / "anon",
            endpoint=server.url,
            token=False,
            cache_dir=server.cache_dir,
        )
