"""Fixtures of the method tests: the tiny suite's digits and the methods built on them."""

import pytest
from support import METHODS_DIR, tiny_digits


@pytest.fixture(scope="module")
def digits():
    """The tiny suite's pretraining set (8x8 digits), loaded once per test module."""
    return tiny_digits()


@pytest.fixture
def build(method_config, digits):
    """build(name, seed=0, **overrides): methods/<name> built on the tiny digits, with these settings."""
    from sslbench.pretrain.trainer import build_method

    def make(name: str, seed: int = 0, **overrides):
        return build_method(METHODS_DIR / name, method_config(name, **overrides), digits, seed)

    return make
