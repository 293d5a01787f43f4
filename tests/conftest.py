"""Fixtures and session settings of every test; the helpers tests import are in support.py."""

import copy
import os
import tempfile

import pytest

from sslbench import kernels

# The CPU kernels every job runs (sslbench.kernels), pinned before torch loads here too: a test that
# compares this process with a job it starts (torchrun, the CLI) compares the same kernels.
kernels.pin()

import torch  # noqa: E402
from support import METHODS_DIR, required_components, tiny_suite_config  # noqa: E402

torch.set_num_threads(1)  # tests share 2 cores; keep each process on one
# Tests call the CLI in this process and expect it to run there: no warm server (tests/workflow/test_warm.py
# turns it on for the processes it starts).
os.environ.setdefault("SSLBENCH_WARM", "0")
# What the jobs remember between processes (sslbench.memo), for every test and the jobs it starts: kept
# out of the user's own cache.
os.environ.setdefault("SSLBENCH_CACHE_DIR", os.path.join(tempfile.gettempdir(), "sslbench-test-cache"))


def pytest_configure(config):
    required_components()  # a misspelt name would make the requirement vacuous: refuse it at once


@pytest.fixture
def suite_config():
    return tiny_suite_config()


@pytest.fixture
def method_config(suite_config):
    from sslbench.plan.settings import resolve_method_config

    def make(method: str, **overrides) -> dict:
        cfg = copy.deepcopy(suite_config)
        if overrides:
            cfg["method_overrides"] = {method: overrides}
        return resolve_method_config(cfg, METHODS_DIR, method)

    return make
