"""Repo id and path validation happen before any network call."""

import pytest

from lerobot_pipe.hub import PublishError, publish_folder, validate_repo_id


@pytest.mark.parametrize(
    "repo_id", ["alice/act-policy", "my-org/pi0_fast.v2", "A1/b", "user/" + "x" * 96]
)
def test_valid_repo_ids(repo_id):
    assert validate_repo_id(repo_id) == repo_id


@pytest.mark.parametrize(
    ("repo_id", "why"),
    [
        ("../x", "'..'"),
        ("a/../../b", "'..'"),
        ("/abs", "absolute"),
        ("/abs/x", "absolute"),
        ("a\\b", "backslash"),
        ("alice\\..\\x", "backslash"),
        ("", "namespace/name"),
        ("justname", "exactly one '/'"),
        ("a/b/c", "exactly one '/'"),
        ("a/", "must not be empty"),
        ("/a", "absolute"),
        ("alice/", "must not be empty"),
        ("alice/-x", "letters, digits"),
        ("alice/x.", "letters, digits"),
        ("alice/has space", "letters, digits"),
        ("alice/a--b", "'--'"),
        ("alice/" + "x" * 97, "at most 96"),
    ],
)
def test_invalid_repo_ids(repo_id, why):
    with pytest.raises(PublishError, match="invalid repo_id") as info:
        validate_repo_id(repo_id)
    assert why in str(info.value)


def test_publish_rejects_bad_ids_and_paths_before_any_request(hub_server, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    for bad in ("../x", "a/../../b", "/abs"):
        with pytest.raises(PublishError, match="invalid repo_id"):
            publish_folder(tmp_path, bad, token=hub_server.token, endpoint=hub_server.url)
    for bad_path in ("../up", "a/../../b", "/abs", "a\\b"):
        with pytest.raises(PublishError, match="invalid path_in_repo"):
            publish_folder(
                tmp_path,
                "alice/ok",
                path_in_repo=bad_path,
                token=hub_server.token,
                endpoint=hub_server.url,
            )
    with pytest.raises(PublishError, match="invalid repo_type"):
        publish_folder(tmp_path, "alice/ok", repo_type="bucket", endpoint=hub_server.url)
    with pytest.raises(PublishError, match="invalid tag"):
        publish_folder(tmp_path, "alice/ok", tag="../t", endpoint=hub_server.url)
    assert hub_server.requests == []
