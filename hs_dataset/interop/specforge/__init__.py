"""SpecForge 0.2.0: export to its offline EAGLE-3 data (:mod:`.export`) and import from it (:mod:`.import_`)."""
