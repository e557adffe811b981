"""Tests of hs_dataset.pipeline."""
