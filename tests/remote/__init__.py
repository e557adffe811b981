"""Tests of hs_dataset.remote."""
