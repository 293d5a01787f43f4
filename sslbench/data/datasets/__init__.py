"""One module per dataset (or family of datasets): it reads its own on-disk format and defines its
``DatasetSpec``(s) at its top level, where ``sslbench.data.registry`` finds them.

Files are read by our own parsers, not torchvision's dataset classes: those verify MD5 sums of the
official archives, which real-format test files (and trimmed local copies) cannot pass. torchvision is
used only to download, and only when `download=True`.
"""
