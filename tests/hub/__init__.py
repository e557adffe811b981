"""Tests of hs_dataset.hub."""
