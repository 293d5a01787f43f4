"""Planning: the settings, the runs they ask for and what the Snakefile needs (no torch)."""
