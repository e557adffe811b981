"""Trainer formats: export to and import from speculators and SpecForge layouts."""
