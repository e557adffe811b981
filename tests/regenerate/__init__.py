"""Tests of hs_dataset.regenerate."""
