"""Regeneration: every assistant turn rewritten by the target model before capture."""
