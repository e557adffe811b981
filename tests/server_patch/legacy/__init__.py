"""Tests of hs_dataset.server_patch.legacy."""
