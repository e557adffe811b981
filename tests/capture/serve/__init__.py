"""Tests of hs_dataset.capture.serve."""
