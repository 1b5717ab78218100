"""The test Hub server itself: protocol details other test folders rely on."""

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest_hub import make_hub_server_fixture
from hub_server import HubServer, git_blob_sha1
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")

paged_hub = make_hub_server_fixture(tree_page_size=2, lfs_threshold=1000)
multipart_hub = make_hub_server_fixture(lfs_threshold=1000, lfs_multipart_chunk_size=1000)


def raw(server, method, path, *, headers=None, body=None):
    req = urllib.request.Request(server.url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_resolve_headers_range_and_errors(hub_server):
    sha = hub_server.commit_files("alice/m", {"a.txt": b"0123456789"})
    status, headers, body = raw(hub_server, "HEAD", "/alice/m/resolve/main/a.txt")
    assert status == 200 and body == b""
    assert headers["X-Repo-Commit"] == sha
    assert headers["ETag"] == f'"{git_blob_sha1(b"0123456789")}"'
    assert headers["Content-Length"] == "10"
    status, headers, body = raw(
        hub_server, "GET", "/alice/m/resolve/main/a.txt", headers={"Range": "bytes=2-5"}
    )
    assert (status, body, headers["Content-Range"]) == (206, b"2345", "bytes 2-5/10")
    status, _, body = raw(
        hub_server, "GET", "/alice/m/resolve/main/a.txt", headers={"Range": "bytes=7-"}
    )
    assert (status, body) == (206, b"789")

    for path, code in (
        ("/alice/m/resolve/main/missing.txt", "EntryNotFound"),
        ("/alice/m/resolve/nope/a.txt", "RevisionNotFound"),
        ("/alice/other/resolve/main/a.txt", "RepoNotFound"),
        ("/api/models/alice/other", "RepoNotFound"),
        ("/api/models/alice/m/revision/nope", "RevisionNotFound"),
        ("/api/datasets/alice/m", "RepoNotFound"),
    ):
        status, headers, _ = raw(hub_server, "GET", path)
        assert (status, headers.get("X-Error-Code")) == (404, code), path


def test_auth(hub_server):
    body = json.dumps({"name": "x", "organization": "alice"}).encode()
    assert raw(hub_server, "POST", "/api/repos/create", body=body)[0] == 401
    bad = {"Authorization": "Bearer hf_nope"}
    status, headers, _ = raw(hub_server, "GET", "/api/models/alice/x", headers=bad)
    assert status == 401
    assert headers["X-Error-Message"] == "Invalid credentials in Authorization header"
    read = {"Authorization": f"Bearer {hub_server.read_token}"}
    assert raw(hub_server, "POST", "/api/repos/create", body=body, headers=read)[0] == 403
    write = {"Authorization": f"Bearer {hub_server.token}"}
    status, _, out = raw(hub_server, "POST", "/api/repos/create", body=body, headers=write)
    assert status == 200 and json.loads(out)["url"] == f"{hub_server.url}/alice/x"
    status, _, out = raw(hub_server, "POST", "/api/repos/create", body=body, headers=write)
    assert status == 409 and json.loads(out)["url"] == f"{hub_server.url}/alice/x"


def test_create_repo_exist_ok_and_empty_commit(hub_server):
    api = HfApi(endpoint=hub_server.url, token=hub_server.token)
    api.create_repo("alice/m")
    api.create_repo("alice/m", exist_ok=True)
    with pytest.raises(HfHubHTTPError) as info:
        api.create_repo("alice/m")
    assert info.value.response.status_code == 409
    head = hub_server.head("alice/m")
    ndjson = b"\n".join(
        json.dumps(line).encode()
        for line in (
            {"key": "header", "value": {"summary": "noop", "description": ""}},
            {
                "key": "file",
                "value": {
                    "path": ".gitattributes",
                    "content": base64.b64encode(
                        hub_server.read_file("alice/m", ".gitattributes")
                    ).decode(),
                    "encoding": "base64",
                },
            },
        )
    )
    status, _, out = raw(
        hub_server,
        "POST",
        "/api/models/alice/m/commit/main",
        body=ndjson,
        headers={"Authorization": f"Bearer {hub_server.token}"},
    )
    assert status == 200 and json.loads(out)["commitOid"] == head
    assert hub_server.commit_count("alice/m") == 1


def test_tree_pagination_paths_info_commits_and_tags(paged_hub, tmp_path):
    server = paged_hub
    api = HfApi(endpoint=server.url, token=server.token)
    files = {f"d{i}/f{j}.json": f"{i}{j}" for i in range(3) for j in range(2)}
    server.commit_files("alice/m", files)
    sha = server.commit_files("alice/m", {"big.bin": b"x" * 1500})
    entries = list(api.list_repo_tree("alice/m", recursive=True))
    assert {e.path for e in entries} == set(files) | {"d0", "d1", "d2", ".gitattributes", "big.bin"}
    assert len(server.find_requests(r"/tree/", method="GET")) == 6  # 11 entries, 2 per page
    big = next(e for e in entries if e.path == "big.bin")
    assert big.lfs is not None and big.lfs.size == 1500
    assert [e.path for e in api.list_repo_tree("alice/m", path_in_repo="d1")] == [
        "d1/f0.json",
        "d1/f1.json",
    ]
    info = api.get_paths_info("alice/m", ["d0", "big.bin", "missing"])
    assert sorted(e.path for e in info) == ["big.bin", "d0"]
    assert [c.commit_id for c in api.list_repo_commits("alice/m")][0] == sha
    assert len(api.list_repo_commits("alice/m")) == server.commit_count("alice/m") == 3

    api.create_tag("alice/m", tag="v1", revision=sha)
    with pytest.raises(HfHubHTTPError):
        api.create_tag("alice/m", tag="v1")
    api.create_tag("alice/m", tag="v1", exist_ok=True)
    assert [t.name for t in api.list_repo_refs("alice/m").tags] == ["v1"]
    path = hf_hub_download(
        "alice/m",
        "big.bin",
        revision="v1",
        endpoint=server.url,
        local_dir=tmp_path,
        cache_dir=server.cache_dir,
    )
    assert Path(path).read_bytes() == b"x" * 1500
    api.delete_tag("alice/m", tag="v1")
    assert server.tags("alice/m") == {}


def test_multipart_lfs_upload(multipart_hub):
    server = multipart_hub
    api = HfApi(endpoint=server.url, token=server.token)
    api.create_repo("alice/m")
    data = bytes(range(256)) * 14  # 3584 bytes: 4 parts
    api.upload_file(path_or_fileobj=data, path_in_repo="w.safetensors", repo_id="alice/m")
    assert server.read_file("alice/m", "w.safetensors") == data
    assert len(server.find_requests(r"^/_lfs/part/", method="PUT")) == 4
    assert server.find_requests(r"^/_lfs/complete/", method="POST")[0].status == 200


def test_faults_log_and_reload(tmp_path):
    root = tmp_path / "hub"
    with HubServer(root) as server:
        server.commit_files("alice/m", {"a.json": "{}"}, repo_type="dataset")
        server.inject_fault(r"^/api/datasets/", times=2, status=500)
        assert server.pending_faults == 2
        for expected in (500, 500, 200):
            assert raw(server, "GET", "/api/datasets/alice/m")[0] == expected
        assert [r.status for r in server.requests] == [500, 500, 200]
        assert server.pending_faults == 0
    with HubServer(root) as again:  # repos persist on disk
        assert again.read_file("alice/m", "a.json", repo_type="dataset") == b"{}"


def test_fixture_points_default_endpoint_and_subprocess_env(hub_server, tmp_path):
    sha = hub_server.commit_files("alice/m", {"a.json": "{}"})
    # In-process: calls that forget endpoint= still reach the local server, never the real Hub.
    assert HfApi(token=hub_server.token).model_info("alice/m").sha == sha
    path = hf_hub_download("alice/m", "a.json", local_dir=tmp_path / "dl")
    assert Path(path).read_text() == "{}"
    # Subprocesses read the import-time settings from env().
    code = "from huggingface_hub import HfApi; print(HfApi().model_info('alice/m').sha)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **hub_server.env()},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == sha
    assert hub_server.requests[-1].headers["Authorization"] == f"Bearer {hub_server.token}"


def test_deletions(hub_server):
    api = HfApi(endpoint=hub_server.url, token=hub_server.token)
    hub_server.commit_files("alice/m", {"a/x.json": "1", "a/y.json": "2", "b.json": "3"})
    api.delete_file("b.json", repo_id="alice/m")
    api.delete_folder("a", repo_id="alice/m")
    assert hub_server.list_files("alice/m") == [".gitattributes"]
    with pytest.raises(HfHubHTTPError):
        api.delete_file("b.json", repo_id="alice/m")
    assert hub_server.commit_count("alice/m") == 4
