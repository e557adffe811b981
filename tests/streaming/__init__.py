"""Tests of hs_dataset.streaming."""
