"""Tests of hs_dataset.codecs."""
