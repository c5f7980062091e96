"""What a worker takes back from a sandbox pod is the Agent's, so untrusted: a tar naming a path
outside its tree, or one larger than the bound, is refused whole, and the worker's copy stays
as it was before the turn (real tar streams, real files)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from runtime_bridge.pod_files import Bounded, unpack
from runtime_bridge.providers.errors import SandboxUnavailable


def tar_of(*entries: tuple[str, bytes]) -> io.BytesIO:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for name, content in entries:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return data


def workspace(tmp_path: Path) -> Path:
    tree = tmp_path / "work" / "workspaces" / "mine"
    tree.mkdir(parents=True)
    (tree / "notes.txt").write_text("before the turn")
    return tree


@pytest.mark.parametrize("name", ["../theirs/notes.txt", "/etc/amux-planted", "./a/../../x"])
def test_a_stream_back_naming_a_path_outside_its_tree_is_refused_and_nothing_is_written(
    tmp_path: Path, name: str
) -> None:
    tree = workspace(tmp_path)
    stream = tar_of(("./notes.txt", b"after the turn"), (name, b"planted"))
    with pytest.raises(SandboxUnavailable, match="was refused") as refused:
        unpack(stream, tree)
    assert refused.value.code == "sandbox_unavailable"
    assert (tree / "notes.txt").read_text() == "before the turn"
    # Nothing beside the tree either: no staging left, nothing planted.
    assert [p.name for p in tree.parent.iterdir()] == ["mine"]
    assert not (tmp_path / "work" / "workspaces" / "theirs").exists()
    assert not Path("/etc/amux-planted").exists()


def test_a_stream_back_replaces_the_tree_whole_links_within_it_kept(tmp_path: Path) -> None:
    tree = workspace(tmp_path)
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:
        for name, content in (("./src/main.py", b"print(1)"),):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        link = tarfile.TarInfo("./current")
        link.type = tarfile.SYMTYPE
        link.linkname = "src/main.py"
        tar.addfile(link)
    unpack(stream, tree)
    # What the Agent removed in its pod is gone here too; what it made is here.
    assert sorted(p.name for p in tree.iterdir()) == ["current", "src"]
    assert (tree / "current").read_text() == "print(1)"
    assert [p.name for p in tree.parent.iterdir()] == ["mine"]


def test_a_stream_back_past_its_bound_is_refused_before_it_is_unpacked(tmp_path: Path) -> None:
    tree = workspace(tmp_path)
    spool = io.BytesIO()
    sink = Bounded(spool, tree, 1024)
    sink.write(b"x" * 1000)
    with pytest.raises(SandboxUnavailable, match="larger than 1 KiB"):
        sink.write(b"x" * 100)
    assert (tree / "notes.txt").read_text() == "before the turn"
