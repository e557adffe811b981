"""Tests of hs_dataset.config."""
