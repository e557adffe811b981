"""Tests of hs_dataset.cli."""
