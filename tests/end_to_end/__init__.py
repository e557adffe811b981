"""End-to-end tests that cross several packages: the pipeline, bad input through every entry point, kill -9 and resume."""
