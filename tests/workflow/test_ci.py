"""CI runs the README's test command and cannot go green with its real-component tests skipped."""

import re

import pytest
from support import COMPONENTS, REPO, require, required_components


def readme_test_command() -> str:
    section = (REPO / "README.md").read_text().split("## Test it", 1)[1]
    return re.search(r"```bash\n(.+?)\n```", section, re.S).group(1)


def test_ci_runs_the_readme_test_command_with_every_component_required_and_skips_listed():
    script = (REPO / ".ci" / "run").read_text()
    command = readme_test_command()
    assert script.rstrip().splitlines()[-1] == command  # verbatim, as the last step
    assert "ruff check . && ruff format --check . && python -m pytest -q -rs" in command
    required = re.search(r"^export SSLBENCH_REQUIRE=(\S+)$", script, re.M).group(1)
    assert sorted(required.split(",")) == sorted(COMPONENTS)


def test_a_missing_component_skips_unless_required_then_fails(monkeypatch):
    monkeypatch.delenv("SSLBENCH_REQUIRE", raising=False)
    require("chromium", None)  # present: nothing happens
    with pytest.raises(pytest.skip.Exception, match="no chromium: /usr/bin/chromium is absent"):
        require("chromium", "/usr/bin/chromium is absent")
    monkeypatch.setenv("SSLBENCH_REQUIRE", "slurm, chromium")
    require("chromium", None)
    with pytest.raises(pytest.fail.Exception, match=r"chromium is required here \(SSLBENCH_REQUIRE\)"):
        require("chromium", "/usr/bin/chromium is absent")
    with pytest.raises(pytest.skip.Exception):
        require("fashion_mnist", "not installed")  # not named: still a skip
    monkeypatch.setenv("SSLBENCH_REQUIRE", "slurm,chromum")  # a misspelt name would require nothing
    with pytest.raises(pytest.UsageError, match=r"unknown components \['chromum'\]"):
        required_components()
