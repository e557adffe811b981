"""Tests of hs_dataset.formats."""
