"""sslbench: reproduce self-supervised learning methods in one harness and compare them."""
from .method import DataInfo, EpochContext, Method

__all__ = ["DataInfo", "EpochContext", "Method"]
__version__ = "0.1.0"
