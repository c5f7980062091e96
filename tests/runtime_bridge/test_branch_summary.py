"""The branch summary's pure core: git's output read within fixed budgets, the diff cut with
notes saying what it leaves out, and the warning naming files too large to commit."""

from __future__ import annotations

from hub.contract import ChangedFile
from runtime_bridge.branch_summary import (
    DIFF_FILE_MAX,
    NO_OBJECT,
    TOKEN_MAX,
    Oversized,
    RawListing,
    bounded_diff,
    changed_files,
    diff_notes,
    not_committed,
    numstat_counts,
    object_sizes,
    plan_diff,
)

MiB = 1024 * 1024


def oid(n: int) -> str:
    return f"{n:040x}"


def raw(*entries: tuple[bytes, str, str]) -> bytes:
    """``git diff --raw -z --no-renames --abbrev=40`` for ``(path, old, new)``."""
    return b"".join(
        f":100644 100644 {old} {new} M".encode() + b"\0" + path + b"\0"
        for path, old, new in entries
    )


def test_the_listing_keeps_the_first_files_within_its_budgets_and_counts_every_one() -> None:
    output = raw(*((f"src/file{n:03}.py".encode(), oid(n), oid(n + 1000)) for n in range(300)))
    listing = RawListing(keep=100, keep_bytes=10_000)
    # Whatever the pieces git's output arrives in.
    for start in range(0, len(output), 7):
        listing.feed(output[start : start + 7])
    assert listing.total == 300 and not listing.complete
    assert len(listing.entries) == 100
    assert listing.entries[0].path == "src/file000.py"
    assert (listing.entries[99].old, listing.entries[99].new) == (oid(99), oid(1099))

    by_bytes = RawListing(keep=1000, keep_bytes=15 * 10)
    by_bytes.feed(output)
    assert len(by_bytes.entries) == 10 and by_bytes.total == 300


def test_a_submodules_commit_is_no_object_to_size_and_goes_into_the_diff() -> None:
    listing = RawListing()
    listing.feed(f":160000 160000 {oid(1)} {oid(2)} M".encode() + b"\0vendor/lib\0")
    plan = plan_diff(listing, {})
    assert plan.included == (b"vendor/lib",) and not plan.too_large


def test_a_name_longer_than_any_file_system_allows_is_counted_never_held() -> None:
    huge = b"d/" * TOKEN_MAX
    listing = RawListing()
    listing.feed(
        raw((b"a.txt", NO_OBJECT, oid(1)), (huge, NO_OBJECT, oid(2)), (b"z", oid(3), oid(4)))
    )
    assert listing.total == 3
    # Kept in order: nothing after the one not kept.
    assert [e.path for e in listing.entries] == ["a.txt"]


def test_a_file_over_the_bound_on_either_side_is_too_large_and_the_diff_stops_at_its_budget() -> (
    None
):
    listing = RawListing()
    listing.feed(
        raw(
            (b"added-huge.bin", NO_OBJECT, oid(1)),
            (b"notes.txt", oid(2), oid(3)),
            (b"shrunk.csv", oid(4), oid(5)),
            (b"unknown.dat", NO_OBJECT, oid(6)),
            (b"a.txt", NO_OBJECT, oid(7)),
            (b"b.txt", NO_OBJECT, oid(8)),
        )
    )
    sizes = object_sizes(
        f"{oid(1)} {3 * 1024**3}\n{oid(2)} 10\n{oid(3)} 12\n{oid(4)} {2 * MiB}\n{oid(5)} 5\n"
        f"{oid(6)} missing\n{oid(7)} 600000\n{oid(8)} 600000\n"
    )
    plan = plan_diff(listing, sizes, input_max=700_000, listed_max=3)
    # A size git does not know is never read to find out.
    assert plan.too_large == {b"added-huge.bin", b"shrunk.csv", b"unknown.dat"}
    # In order while their contents fit: b.txt would pass the budget.
    assert plan.included == (b"notes.txt", b"a.txt")
    assert plan.left_out == 1
    assert [e.path for e in plan.listed] == ["added-huge.bin", "notes.txt", "shrunk.csv"]

    counts = numstat_counts(b"1\t1\tnotes.txt\0-\t-\tshrunk.csv\0")
    assert changed_files(plan, counts) == (
        ChangedFile("added-huge.bin", None, None, too_large=True),
        ChangedFile("notes.txt", 1, 1),
        ChangedFile("shrunk.csv", None, None, too_large=True),
    )
    assert diff_notes(plan, "git diff took longer than 60 s") == [
        "# amux: not in this diff, over 1 MiB: added-huge.bin, shrunk.csv, unknown.dat",
        "# amux: 1 more changed file(s) are not in this diff; the branch holds them",
        "# amux: this diff was cut short: git diff took longer than 60 s",
    ]


def test_the_diff_and_its_notes_fit_the_byte_budget_cut_at_a_line() -> None:
    notes = ["# amux: not in this diff, over 1 MiB: big.bin"]
    whole, cut = bounded_diff(b"+one\n+two\n", notes, limit=1000)
    assert (whole, cut) == ("+one\n+two\n" + notes[0] + "\n", False)

    # More than the budget came (git was stopped there), some of it not UTF-8.
    data = b"".join(b"+line %d \xff\xfe\n" % n for n in range(5000))
    text, cut = bounded_diff(data, notes, limit=4096)
    assert cut
    assert len(text.encode("utf-8")) <= 4096
    body, _, tail = text.partition("# amux: this diff was cut at 4 KiB\n")
    assert body.endswith("\n") and body.startswith("+line 0 ")
    assert tail == notes[0] + "\n"


def test_files_too_large_to_commit_are_named_with_their_sizes_the_rest_counted() -> None:
    assert not_committed("amux/1a2b", []) is None
    found = [Oversized(b"sparse.bin", 3 * 1024**3), Oversized(b"dump.sql", 60 * MiB)]
    assert not_committed("amux/1a2b", found) == (
        "not committed to amux/1a2b, too large (over 50 MiB each): dump.sql (60 MiB), "
        "sparse.bin (3 GiB); they stay in the checkout"
    )
    many = [Oversized(f"f{n:02}".encode(), DIFF_FILE_MAX * 100) for n in range(25)]
    said = not_committed("amux/1a2b", many)
    assert said is not None and said.count("(100 MiB)") == 10 and "and 15 more" in said
