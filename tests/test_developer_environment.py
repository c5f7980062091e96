"""A developer's own AMUX_* variables never reach the tests: only composition roots read them."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

# Tests that build the service or its settings and once failed with the bot configured in the
# developer's shell: create_app read the Feishu settings from the environment by default.
SENSITIVE = (
    "tests/bot/test_feishu_config.py",
    "tests/bot/test_observability.py::test_two_apps_in_one_process_keep_separate_metrics",
    "tests/hub/test_rpc_params.py::test_a_string_with_a_lone_surrogate_is_refused_not_a_500",
    "tests/runtime_bridge/test_worker_slots.py::test_one_slot_runs_one_turn_at_a_time",
)


def test_the_fast_tier_passes_with_a_feishu_app_configured_in_the_shell() -> None:
    env = {
        **os.environ,
        "AMUX_FEISHU_APP_ID": "cli_dev",
        "AMUX_FEISHU_APP_SECRET": "x",
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not e2e"]
        + list(SENSITIVE),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
