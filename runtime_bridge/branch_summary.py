"""What a project turn's branch changed, summed up from git's output within fixed budgets.

The files on a conversation's branch are the Agent's: a ``truncate -s 3G`` file costs it no disk
and would cost any git command that reads it gigabytes of memory and minutes of CPU. The worker
therefore never lets git read a large file's content for the summary:

- a file over ``COMMIT_FILE_MAX`` (apparent size, whatever disk it uses) is not committed at all,
  and the turn's result names it (``not_committed``);
- of the files changed against the default branch, the first ``LISTED_MAX`` are kept from
  ``git diff --raw`` (whose paths also fit ``LISTED_BYTES``); the rest are only counted;
- a changed file whose content is over ``DIFF_FILE_MAX`` on either side is named as too large
  and neither counted in lines nor put in the diff (git, run with ``core.bigFileThreshold`` at
  the same size, treats it as binary without loading it);
- the diff is asked for named files only, in order, while their content adds up to at most
  ``DIFF_INPUT_MAX`` and their names to ``DIFF_ARGS_MAX``; what it says is cut at
  ``BRANCH_DIFF_MAX`` bytes, and notes at its end say what is missing and why.

Pure: git's output comes in as bytes, the summary goes out as values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hub.contract import BRANCH_DIFF_MAX, BRANCH_FILES_MAX, ChangedFile

MiB = 1024 * 1024
DIFF_FILE_MAX = 1 * MiB
COMMIT_FILE_MAX = 50 * MiB
LISTED_MAX = 1000
LISTED_BYTES = 256 * 1024
DIFF_INPUT_MAX = 8 * MiB
DIFF_ARGS_MAX = 128 * 1024
# One entry of git's output longer than this (a name no file system allows) is counted, not kept.
TOKEN_MAX = 64 * 1024
NO_OBJECT = "0" * 40
GITLINK = b"160000"
# Names a note or warning lists before it counts the rest.
NAMED_MAX = 10


def size_text(size: int) -> str:
    for unit, name in ((1024**3, "GiB"), (MiB, "MiB"), (1024, "KiB")):
        if size >= unit:
            value = size / unit
            return f"{value:.0f} {name}" if value == int(value) else f"{value:.1f} {name}"
    return f"{size} B"


@dataclass(frozen=True)
class RawEntry:
    """One changed file of ``git diff --raw``: its path and the objects on either side (all
    zeros where the file is absent)."""

    name: bytes  # as git names it, for a pathspec
    old: str
    new: str

    @property
    def path(self) -> str:
        """The name as a person reads it (bytes that are not UTF-8 replaced)."""
        return self.name.decode("utf-8", "replace")


@dataclass
class Tokens:
    """NUL-separated tokens from chunks, holding at most ``TOKEN_MAX`` bytes of a partial one."""

    carry: bytearray = field(default_factory=bytearray)
    overlong: bool = False

    def feed(self, chunk: bytes) -> list[bytes | None]:
        """The tokens ``chunk`` completes; None stands for one too long to keep."""
        done: list[bytes | None] = []
        parts = chunk.split(b"\0")
        for part in parts[:-1]:
            if self.overlong or len(self.carry) + len(part) > TOKEN_MAX:
                done.append(None)
            else:
                done.append(bytes(self.carry + part))
            self.carry.clear()
            self.overlong = False
        tail = parts[-1]
        if self.overlong or len(self.carry) + len(tail) > TOKEN_MAX:
            self.carry.clear()
            self.overlong = True
        else:
            self.carry += tail
        return done


class RawListing:
    """``git diff --raw -z --no-renames --abbrev=40`` read as it comes: the first entries that
    fit ``keep`` and ``keep_bytes`` of paths are kept, every entry is counted."""

    def __init__(self, keep: int = LISTED_MAX, keep_bytes: int = LISTED_BYTES) -> None:
        self.keep = keep
        self.room = keep_bytes
        self.entries: list[RawEntry] = []
        self.total = 0
        self._tokens = Tokens()
        self._header: bytes | None = None
        self._full = False

    def feed(self, chunk: bytes) -> None:
        for token in self._tokens.feed(chunk):
            if self._header is None:
                # A header (``:100644 100644 OLD NEW M``), never overlong in git's output.
                self._header = token or b""
                continue
            header, self._header = self._header, None
            self.total += 1
            words = header.lstrip(b":").split()
            if self._full:
                continue
            if (
                token is None
                or len(words) < 4
                or len(self.entries) >= self.keep
                or len(token) > self.room
            ):
                # In order: once one entry is not kept, none after it is.
                self._full = True
                continue
            self.room -= len(token)
            sides = [
                # A submodule's commit is no object here, and its diff is one line: no size.
                NO_OBJECT if mode == GITLINK else oid.decode("ascii", "replace")
                for mode, oid in zip(words[:2], words[2:4], strict=True)
            ]
            self.entries.append(RawEntry(token, sides[0], sides[1]))

    @property
    def complete(self) -> bool:
        """Whether every changed file was kept."""
        return len(self.entries) == self.total


def object_sizes(batch_check: str) -> dict[str, int]:
    """``git cat-file --batch-check='%(objectname) %(objectsize)'`` as object id -> size;
    an object git reports missing is left out."""
    sizes: dict[str, int] = {}
    for line in batch_check.splitlines():
        words = line.split()
        if len(words) == 2 and words[1].isdigit():
            sizes[words[0]] = int(words[1])
    return sizes


@dataclass(frozen=True)
class DiffPlan:
    """Which of the kept files the card lists, which go into the diff, which are too large."""

    listed: tuple[RawEntry, ...]
    included: tuple[bytes, ...]
    too_large: frozenset[bytes]
    # Changed files under DIFF_FILE_MAX left out of the diff for its budgets (or never kept).
    left_out: int


def plan_diff(
    listing: RawListing,
    sizes: Mapping[str, int],
    *,
    file_max: int = DIFF_FILE_MAX,
    input_max: int = DIFF_INPUT_MAX,
    args_max: int = DIFF_ARGS_MAX,
    listed_max: int = BRANCH_FILES_MAX,
) -> DiffPlan:
    """The diff's files, in git's order, while their contents fit ``input_max`` and their names
    ``args_max``. A file whose size is unknown (its object is missing) counts as too large."""

    def size(oid: str) -> int:
        return 0 if oid == NO_OBJECT else sizes.get(oid, file_max + 1)

    too_large: set[bytes] = set()
    included: list[bytes] = []
    spent = named = 0
    left_out = listing.total - len(listing.entries)
    full = False
    for entry in listing.entries:
        old, new = size(entry.old), size(entry.new)
        if max(old, new) > file_max:
            too_large.add(entry.name)
            continue
        cost, name = old + new, len(entry.name) + 1
        if full or spent + cost > input_max or named + name > args_max:
            full = True
            left_out += 1
            continue
        spent += cost
        named += name
        included.append(entry.name)
    return DiffPlan(
        tuple(listing.entries[:listed_max]), tuple(included), frozenset(too_large), left_out
    )


def numstat_counts(output: bytes) -> dict[bytes, tuple[int | None, int | None]]:
    """``git diff --numstat -z --no-renames`` as path -> (lines added, removed); ``-`` (a binary
    file) is None."""
    counts: dict[bytes, tuple[int | None, int | None]] = {}
    for entry in output.split(b"\0"):
        added, _, rest = entry.partition(b"\t")
        removed, _, path = rest.partition(b"\t")
        if not path:
            continue
        counts[path] = (
            int(added) if added.isdigit() else None,
            int(removed) if removed.isdigit() else None,
        )
    return counts


def changed_files(
    plan: DiffPlan, counts: Mapping[bytes, tuple[int | None, int | None]]
) -> tuple[ChangedFile, ...]:
    """The files the card lists: their line counts, or too large (never counted)."""
    files = []
    for entry in plan.listed:
        if entry.name in plan.too_large:
            files.append(ChangedFile(entry.path, None, None, too_large=True))
        else:
            added, removed = counts.get(entry.name, (None, None))
            files.append(ChangedFile(entry.path, added, removed))
    return tuple(files)


def _named(paths: Iterable[bytes]) -> str:
    names = sorted(path.decode("utf-8", "replace") for path in paths)
    shown = ", ".join(names[:NAMED_MAX])
    more = len(names) - NAMED_MAX
    return f"{shown} and {more} more" if more > 0 else shown


def diff_notes(plan: DiffPlan, cut_short: str | None = None) -> list[str]:
    """The lines the diff ends with for what it does not hold."""
    notes = []
    if plan.too_large:
        notes.append(
            f"# amux: not in this diff, over {size_text(DIFF_FILE_MAX)}: {_named(plan.too_large)}"
        )
    if plan.left_out:
        notes.append(
            f"# amux: {plan.left_out} more changed file(s) are not in this diff; "
            "the branch holds them"
        )
    if cut_short is not None:
        notes.append(f"# amux: this diff was cut short: {cut_short}")
    return notes


def bounded_diff(data: bytes, notes: list[str], limit: int = BRANCH_DIFF_MAX) -> tuple[str, bool]:
    """``data`` (git's diff, of which more may have followed than ``limit``) with ``notes`` at
    its end, all within ``limit`` bytes of UTF-8: the diff is cut at a line's end to make room,
    with a note that it was. Returns the text and whether the diff was cut."""
    tail = "".join(f"{note}\n" for note in notes).encode("utf-8", "replace")[: limit // 4]
    tail = tail[: tail.rfind(b"\n") + 1]
    cut_note = f"# amux: this diff was cut at {size_text(limit)}\n".encode()
    # Bytes that are not UTF-8 each become U+FFFD (three bytes): measured once decoded.
    text = data.decode("utf-8", "replace").encode("utf-8")
    cut = len(text) + len(tail) > limit
    if cut:
        text = text[: max(0, limit - len(tail) - len(cut_note))]
        text = text[: text.rfind(b"\n") + 1]
        tail = cut_note + tail
    return (text + tail).decode("utf-8", "replace"), cut


@dataclass(frozen=True)
class Oversized:
    """A file in a checkout too large to commit: its name as git lists it, its apparent size."""

    name: bytes
    size: int

    @property
    def path(self) -> str:
        return self.name.decode("utf-8", "replace")


def not_committed(branch: str, files: Iterable[Oversized]) -> str | None:
    """The warning naming files left out of the branch for their size; None when there are
    none."""
    found = sorted(files, key=lambda f: f.path)
    if not found:
        return None
    named = [f"{f.path} ({size_text(f.size)})" for f in found[:NAMED_MAX]]
    more = len(found) - NAMED_MAX
    listed = ", ".join(named) + (f" and {more} more" if more > 0 else "")
    return (
        f"not committed to {branch}, too large (over {size_text(COMMIT_FILE_MAX)} each): "
        f"{listed}; they stay in the checkout"
    )
