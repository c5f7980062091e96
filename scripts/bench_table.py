"""Run `make bench` several times and write the README's Performance figures from the runs.

Every printed line of the benchmarks that holds figures becomes one row; each figure in it is
shown as the median over the runs with its min–max, so a reader sees the spread of a noisy
machine instead of its best moment. The rows go between the markers

    <!-- bench-table:begin --> ... <!-- bench-table:end -->

in README.md, with the date, the number of runs and the load average before each run.

Run: .venv/bin/python -m scripts.bench_table [--runs 3] [--logs DIR] [--from-logs DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BEGIN = "<!-- bench-table:begin -->"
END = "<!-- bench-table:end -->"
# "1,234" is one figure; "911, 767" are two.
NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
SECTION = re.compile(r"^== (.*) ==$")
# Lines that describe the run or come from a server's log, not a measurement.
SKIP = ("machine:", "scope:", "for script", "#", "INFO", "WARNING", "DEBUG", "ERROR")
# A benchmark's best run is printed for its author; the table shows medians and spreads only.
BEST = re.compile(r"\s*\(best\s+[\d.,]+\)")
# A benchmark's progress as it runs (which round, how many turns done), not a measurement.
PROGRESS = re.compile(r": repeat \S+ \d+/\d+ turns$|^\S+…$")
# A run's verdict on its target; runs may differ, and the table shows the figures instead.
VERDICT = re.compile(r"\b(?:meets|misses|MISSES)\b")


@dataclass
class Row:
    section: str
    template: str
    values: list[list[float]] = field(default_factory=list)
    decimals: list[int] = field(default_factory=list)


Key = tuple[str, str, int]


def parse(output: str) -> dict[Key, tuple[list[float], list[int]]]:
    """(section, line with figures replaced by {}, how many such lines came before in the
    section) -> the figures and their decimal places."""
    rows: dict[Key, tuple[list[float], list[int]]] = {}
    seen: dict[tuple[str, str], int] = {}
    section = ""
    # A line ending in ':', or a one-word line without figures (a provider's name), names the
    # rows under it.
    labels: list[tuple[int, str]] = []  # (indent, label), outermost first
    for raw in output.splitlines():
        line = VERDICT.sub("target", BEST.sub("", raw.strip()))
        indent = len(raw) - len(raw.lstrip())
        # A label names only the lines indented under it.
        while labels and labels[-1][0] >= indent and line:
            labels.pop()
        heading = SECTION.match(line)
        if heading:
            # The title up to its first comma; the rows carry the details.
            section, labels = heading.group(1).split(", ")[0], []
            continue
        if not line or line.startswith(SKIP) or PROGRESS.search(line):
            continue
        if line.endswith(":"):
            # A heading over the rows that follow (which requests, which kind of time).
            labels.append((indent, line[:-1]))
            continue
        if not NUMBER.search(line):
            if len(line) <= 20 and " " not in line:
                labels.append((indent, line))
            continue
        if labels:
            line = ": ".join([*(label for _, label in labels), line])
        tokens = NUMBER.findall(line)
        template = NUMBER.sub("{}", line.replace("{", "{{").replace("}", "}}"))
        template = re.sub(r"\s{2,}", " ", template)
        values = [float(t.replace(",", "")) for t in tokens]
        decimals = [len(t.split(".")[1]) if "." in t else 0 for t in tokens]
        # Lines that differ only in their figures (200 and 2,000 documents) stay apart.
        count = seen.get((section, template), 0)
        seen[(section, template)] = count + 1
        rows[(section, template, count)] = (values, decimals)
    return rows


def combine(outputs: list[str]) -> list[Row]:
    combined: dict[Key, Row] = {}
    for output in outputs:
        for key, (values, decimals) in parse(output).items():
            row = combined.setdefault(key, Row(key[0], key[1]))
            row.values.append(values)
            row.decimals = row.decimals or decimals
    return list(combined.values())


def spread(samples: list[float], decimals: int) -> str:
    def show(value: float) -> str:
        return f"{value:,.{decimals}f}"

    middle = show(statistics.median(samples))
    low, high = show(min(samples)), show(max(samples))
    return middle if low == high else f"{middle} ({low}–{high})"


def render_row(row: Row) -> str:
    width = min(len(v) for v in row.values)
    figures = [
        spread([v[i] for v in row.values], row.decimals[i] if i < len(row.decimals) else 1)
        for i in range(width)
    ]
    text = row.template
    try:
        text = text.format(*figures, *["?"] * (text.count("{}") - width))
    except (IndexError, ValueError):
        text = row.template + " " + ", ".join(figures)
    return text.replace("|", "\\|")


def table(outputs: list[str], loads: list[str], when: str) -> str:
    lines = [
        BEGIN,
        f"Generated by `scripts/bench_table.py` from {len(outputs)} run(s) of `make bench` on "
        f"{when}, {os.cpu_count()} CPUs; load average (1, 5, 15 min) before each run: "
        + "; ".join(loads)
        + ". Each figure is the median of the runs with their min–max.",
        "",
        "| benchmark | figures: median (min–max) over the runs | runs |",
        "|---|---|---|",
    ]
    for row in combine(outputs):
        lines.append(f"| {row.section.replace('|', '/')} | {render_row(row)} | {len(row.values)} |")
    lines.append(END)
    return "\n".join(lines)


def write_readme(block: str) -> None:
    text = README.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + block + tail
    else:
        marker = "## Performance\n"
        if marker not in text:
            raise SystemExit("README.md has no Performance section")
        head, tail = text.split(marker, 1)
        text = head + marker + "\n" + block + "\n" + tail
    README.write_text(text)


def run_bench(logs: Path, runs: int) -> tuple[list[str], list[str]]:
    outputs: list[str] = []
    loads: list[str] = []
    for number in range(1, runs + 1):
        loads.append(", ".join(f"{v:.2f}" for v in os.getloadavg()))
        print(f"make bench, run {number} of {runs} ...", file=sys.stderr, flush=True)
        done = subprocess.run(
            ["make", "bench"], cwd=REPO, capture_output=True, text=True, check=False
        )
        log = logs / f"run-{number}.txt"
        log.write_text(f"# load average before: {loads[-1]}\n" + done.stdout + done.stderr)
        if done.returncode != 0:
            print(f"make bench failed (status {done.returncode}); see {log}", file=sys.stderr)
        outputs.append(done.stdout)
    return outputs, loads


def read_logs(logs: Path) -> tuple[list[str], list[str]]:
    outputs: list[str] = []
    loads: list[str] = []
    for log in sorted(logs.glob("run-*.txt")):
        text = log.read_text()
        first, _, rest = text.partition("\n")
        loads.append(first.removeprefix("# load average before: "))
        outputs.append(rest)
    return outputs, loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--logs", type=Path, help="where to keep each run's output")
    parser.add_argument("--from-logs", type=Path, help="build the table from earlier runs' logs")
    args = parser.parse_args()
    if args.from_logs:
        outputs, loads = read_logs(args.from_logs)
        when = time.strftime("%Y-%m-%d", time.gmtime(args.from_logs.stat().st_mtime))
    else:
        logs = args.logs or Path(tempfile.mkdtemp(prefix="amux-bench-runs-"))
        logs.mkdir(parents=True, exist_ok=True)
        print(f"logs: {logs}", file=sys.stderr)
        outputs, loads = run_bench(logs, args.runs)
        when = time.strftime("%Y-%m-%d", time.gmtime())
    if not outputs:
        raise SystemExit("no runs to build the table from")
    write_readme(table(outputs, loads, when))
    print(f"README.md: Performance table from {len(outputs)} run(s)", file=sys.stderr)


if __name__ == "__main__":
    main()
