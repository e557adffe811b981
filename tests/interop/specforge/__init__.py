"""Tests of hs_dataset.interop.specforge."""
