"""``amux project`` against a real `amux serve` and real git repositories: text and --json, and
every bad input refused with a clear one-line error that changes nothing."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CliResult, HubProcess, make_repo, running_hub

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    home = tmp_path_factory.mktemp("projects-cli") / "amux-home"
    with running_hub(home) as hub:
        yield hub


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repos")
    make_repo(root / "web")
    make_repo(root / "other", branch="trunk")
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(root / "web"), str(root / "web.git")], check=True
    )
    (root / "plain").mkdir()
    return root


def ok(done: CliResult) -> CliResult:
    assert done.returncode == 0, done.stderr
    return done


def refused(done: CliResult, code: str, words: str) -> str:
    assert done.returncode != 0 and done.stdout == "", done
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: {code}: ") and words in line, line
    return line


def listed(hub: HubProcess) -> list[str]:
    return [p["name"] for p in ok(hub.cli("project", "list", "--json")).json()["projects"]]


def test_the_owner_adds_lists_shows_and_removes_projects_in_text_and_json(
    hub: HubProcess, repos: Path
) -> None:
    added = ok(hub.cli("project", "add", "web", "--path", str(repos / "web")))
    assert added.stdout == "added project web\n"
    remote = ok(
        hub.cli(
            "project",
            "add",
            "web-remote",
            "--remote",
            f"file://{repos / 'web.git'}",
            "--credential-env",
            "WEB_TOKEN",
            "--permissions",
            "read-only",
            "--json",
        )
    ).json()["project"]
    assert remote["kind"] == "remote" and remote["credential_env"] == "WEB_TOKEN"
    assert remote["permissions"] == "read-only" and remote["default_branch"] == "main"

    text = ok(hub.cli("project", "list")).stdout.splitlines()
    assert text[0].split() == [
        "NAME",
        "KIND",
        "SOURCE",
        "BRANCH",
        "PROVIDER",
        "PERMISSIONS",
        "CHATS",
    ]
    assert text[1].split() == ["web", "path", str(repos / "web"), "main", "claude", "-", "0"]
    assert text[2].split()[:2] == ["web-remote", "remote"]

    shown = [line.split() for line in ok(hub.cli("project", "show", "web")).stdout.splitlines()]
    assert ["source", str(repos / "web")] in shown and ["chats", "none"] in shown
    shown_json = ok(hub.cli("project", "show", "web", "--json")).json()
    assert shown_json["project"]["created_at"].endswith("Z") and shown_json["chats"] == []

    assert ok(hub.cli("project", "remove", "web-remote")).stdout == "removed project web-remote\n"
    assert listed(hub) == ["web"]
    refused(hub.cli("project", "show", "web-remote"), "not_found", "no project named")
    ok(hub.cli("project", "remove", "web"))
    assert listed(hub) == []


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["Web", "--path", "{repos}/web"], "invalid_argument", "is not a project name"),
        (["web", "--path", "relative/web"], "invalid_argument", "is not an absolute path"),
        (["web", "--path", "{repos}/plain"], "invalid_argument", "is not a git repository"),
        (["web", "--path", "{repos}/missing"], "invalid_argument", "is not a git repository"),
        (["web", "--path", "{repos}/other"], "invalid_argument", "has no branch 'main'"),
        (["web", "--path", "{repos}/web", "--branch", "../x"], "invalid_argument", "branch"),
        (["web", "--remote", "file://{repos}/nothing.git"], "invalid_argument", "cannot be listed"),
        (
            ["web", "--remote", "https://bob:secret@git.example/web.git"],
            "invalid_argument",
            "--credential-env",
        ),
        (["web", "--remote", "ext::sh -c touch% /tmp/x"], "invalid_argument", "a remote is a URL"),
        (
            ["web", "--remote", "file://{repos}/web.git", "--branch", "dev"],
            "invalid_argument",
            "has no branch 'dev'",
        ),
        (
            ["web", "--path", "{repos}/web", "--credential-env", "TOKEN"],
            "invalid_argument",
            "for a remote",
        ),
        (
            ["web", "--remote", "file://{repos}/web.git", "--credential-env", "AMUX_TOKEN"],
            "invalid_argument",
            "not starting with AMUX_",
        ),
        (["web", "--path", "{repos}/web", "--provider", "nope"], "invalid_argument", "provider"),
        (["web", "--path", "{repos}/web", "--permissions", "yes"], "invalid_argument", "ask"),
        (["web"], "invalid_argument", "exactly one of --path and --remote"),
    ],
)
def test_a_bad_project_is_refused_in_one_line_and_nothing_is_added(
    hub: HubProcess, repos: Path, args: list[str], code: str, words: str
) -> None:
    given = [a.replace("{repos}", str(repos)) for a in args]
    line = refused(hub.cli("project", "add", *given), code, words)
    assert "secret" not in line
    assert listed(hub) == []


def test_an_existing_name_is_a_conflict_and_only_the_owner_manages_projects(
    hub: HubProcess, repos: Path
) -> None:
    ok(hub.cli("project", "add", "dup", "--path", str(repos / "web")))
    try:
        again = hub.cli(
            "project", "add", "dup", "--path", str(repos / "other"), "--branch", "trunk"
        )
        refused(again, "conflict", "already exists")
        assert ok(hub.cli("project", "show", "dup", "--json")).json()["project"]["source"] == str(
            repos / "web"
        )
        ok(hub.cli("principal", "add", "bob"))
        token = ok(hub.cli("token", "issue", "bob")).stdout.strip().splitlines()[-1]
        as_bob = {"AMUX_TOKEN": token}
        refused(hub.cli("project", "list", env=as_bob), "forbidden", "only the owner")
        refused(
            hub.cli("project", "add", "bobs", "--path", str(repos / "web"), env=as_bob),
            "forbidden",
            "only the owner",
        )
        refused(hub.cli("project", "remove", "dup", env=as_bob), "forbidden", "only the owner")
        assert listed(hub) == ["dup"]
    finally:
        ok(hub.cli("project", "remove", "dup"))


FORGE_TOKEN = "glpat-aTokenTheCliMustNeverPrint42"


def test_the_owner_sets_a_projects_forge_from_stdin_or_a_file_and_the_token_is_never_shown(
    hub: HubProcess, repos: Path, tmp_path: Path
) -> None:
    ok(hub.cli("project", "add", "forged", "--path", str(repos / "web")))
    token_file = tmp_path / "token"
    token_file.write_text(FORGE_TOKEN + "\n")
    shown = ok(
        hub.cli(
            "project",
            "forge",
            "forged",
            "--kind",
            "gitlab",
            "--base-url",
            "https://gitlab.example.com/",
            "--repo",
            "group/sub/web",
            "--token-file",
            str(token_file),
        )
    )
    assert shown.stdout == (
        "project forged opens pull requests on gitlab https://gitlab.example.com (group/sub/web)\n"
    )
    again = ok(
        hub.cli(
            "project",
            "forge",
            "forged",
            "--kind",
            "github",
            "--repo",
            "acme/web",
            "--json",
            input=FORGE_TOKEN + "\n",
        )
    ).json()["forge"]
    assert again == {
        "project": "forged",
        "kind": "github",
        "base_url": "https://api.github.com",
        "repo": "acme/web",
    }
    for done in (shown, ok(hub.cli("project", "show", "forged", "--json"))):
        assert FORGE_TOKEN not in done.stdout + done.stderr
    # Nor in what the Hub logged of the requests carrying it.
    assert hub.log_path is not None
    assert FORGE_TOKEN not in hub.log_path.read_text(errors="replace")


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (
            ("--kind", "github", "--base-url", "http://forge.example.com"),
            "invalid_argument",
            "https://",
        ),
        (("--kind", "github"), "invalid_argument", "--repo"),
        (
            ("--kind", "github", "--repo", "acme/web", "--token-file", "/nonexistent/t"),
            "invalid_argument",
            "token file",
        ),
    ],
    ids=["plain-http-off-loopback", "path-project-without-repo", "missing-token-file"],
)
def test_a_bad_forge_is_refused_with_one_line_and_nothing_saved(
    hub: HubProcess, repos: Path, args: tuple[str, ...], code: str, words: str
) -> None:
    if "unforged" not in listed(hub):
        ok(hub.cli("project", "add", "unforged", "--path", str(repos / "web")))
    line = refused(hub.cli("project", "forge", "unforged", *args, input=FORGE_TOKEN), code, words)
    assert FORGE_TOKEN not in line
