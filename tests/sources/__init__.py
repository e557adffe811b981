"""Tests of hs_dataset.sources."""
