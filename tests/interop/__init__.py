"""Tests of hs_dataset.interop."""
