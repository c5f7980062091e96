"""What a worker takes back from a sandbox pod is the Agent's, so untrusted: a tar naming a path
outside its tree, or one larger than the bound, is refused whole, and the worker's copy stays
as it was before the turn (real tar streams, real files)."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import time
from pathlib import Path

import pytest

from runtime_bridge.pod_files import Bounded, manifest, unpack
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
        unpack(stream, tree, manifest(tree))
    assert refused.value.code == "sandbox_unavailable"
    assert (tree / "notes.txt").read_text() == "before the turn"
    # Nothing beside the tree either: no staging left, nothing planted.
    assert [p.name for p in tree.parent.iterdir()] == ["mine"]
    assert not (tmp_path / "work" / "workspaces" / "theirs").exists()
    assert not Path("/etc/amux-planted").exists()


def pod_copy(tree: Path, pod: Path) -> io.BytesIO:
    """What ``tar -c -C <pod's tree> .`` streams back."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:
        tar.add(str(pod), arcname=".")
    return stream


def test_what_the_agent_changed_comes_back_and_another_turns_change_meanwhile_stays(
    tmp_path: Path,
) -> None:
    tree = workspace(tmp_path)
    (tree / "theirs.txt").write_text("as given")
    (tree / "gone.txt").write_text("removed in the pod")
    for name in ("theirs.txt", "gone.txt"):
        os.utime(tree / name, (time.time() - 60, time.time() - 60))
    sent = manifest(tree)
    # The pod's copy, as given, then changed by its Agent.
    pod = tmp_path / "pod"
    shutil.copytree(tree, pod, symlinks=True)
    (pod / "notes.txt").write_text("after the turn")
    (pod / "gone.txt").unlink()
    (pod / "src").mkdir()
    (pod / "src" / "main.py").write_text("print(1)")
    (pod / "current").symlink_to("src/main.py")
    # Meanwhile another turn in the same workspace changed a file this one left alone.
    (tree / "theirs.txt").write_text("changed by another turn")
    unpack(pod_copy(tree, pod), tree, sent)
    assert sorted(p.name for p in tree.iterdir()) == ["current", "notes.txt", "src", "theirs.txt"]
    assert (tree / "notes.txt").read_text() == "after the turn"
    assert (tree / "current").read_text() == "print(1)"
    assert (tree / "theirs.txt").read_text() == "changed by another turn"
    assert sorted(p.name for p in tree.parent.iterdir()) == ["mine"]


def test_a_stream_back_past_its_bound_is_refused_before_it_is_unpacked(tmp_path: Path) -> None:
    tree = workspace(tmp_path)
    spool = io.BytesIO()
    sink = Bounded(spool, tree, 1024)
    sink.write(b"x" * 1000)
    with pytest.raises(SandboxUnavailable, match="larger than 1 KiB"):
        sink.write(b"x" * 100)
    assert (tree / "notes.txt").read_text() == "before the turn"


def test_a_tree_whose_directory_became_a_link_meanwhile_takes_back_nothing(
    tmp_path: Path,
) -> None:
    tree = workspace(tmp_path)
    (tree / "sub").mkdir()
    sent = manifest(tree)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    # While the turn ran, the worker's own copy of a directory was swapped for a link out.
    shutil.rmtree(tree / "sub")
    (tree / "sub").symlink_to(outside)
    stream = tar_of(("notes.txt", b"the agent's edit"), ("sub/new.txt", b"planted"))
    with pytest.raises(SandboxUnavailable):
        unpack(stream, tree, sent)
    assert (tree / "notes.txt").read_text() == "before the turn"
    assert list(outside.iterdir()) == []
