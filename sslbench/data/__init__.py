"""Datasets: one module per dataset under ``datasets/`` (its loader and its ``DatasetSpec``, ``spec``),
found by ``registry``; ``containers`` (``Dataset``, ``ImageSet``), ``images`` (decoding, resizing,
channels, statistics), ``prepared`` (the prepared .npz files), ``files`` (where files are looked for).

Nothing is imported here: the planner imports ``registry`` and the dataset modules, without torch.
"""
