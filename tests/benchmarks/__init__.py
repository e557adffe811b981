"""Tests of the benchmarks' own helpers (benchmarks/, outside the package): what their figures rest on."""
