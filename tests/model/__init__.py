"""Tests of hs_dataset.model."""
