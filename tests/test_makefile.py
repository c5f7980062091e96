"""The Makefile a newcomer starts with: what `make serve` runs, read from make's own dry run."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO

PINNED_CLIS = REPO / "tools" / "agent-clis" / "node_modules" / ".bin"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_serve_puts_the_pinned_agent_clis_first_on_path() -> None:
    # Under `make test` the outer make's flags and variables would leak into this one.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    dry_run = subprocess.run(
        ["make", "--dry-run", "--no-print-directory", "serve"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    serving = [line for line in dry_run.stdout.splitlines() if line.endswith("amux serve")]
    assert serving == [f'PATH="{PINNED_CLIS}:$PATH" .venv/bin/amux serve'], dry_run.stdout
