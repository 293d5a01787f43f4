"""Pretraining: the trainer every method shares, and the pieces methods build on."""
