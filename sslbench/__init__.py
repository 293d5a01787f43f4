"""sslbench: reproduce self-supervised learning methods in one harness and compare them."""

__version__ = "0.1.0"
__all__ = ["DataInfo", "EpochContext", "Method"]


def __getattr__(name):
    # Lazy, so that the Snakefile's imports of sslbench.plan do not pay for importing torch.
    if name in __all__:
        from sslbench.kit import method

        return getattr(method, name)
    raise AttributeError(f"module 'sslbench' has no attribute {name!r}")
