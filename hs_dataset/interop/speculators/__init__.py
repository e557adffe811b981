"""speculators 0.9.0: export to its offline layout (:mod:`.export`), import from it (:mod:`.import_`), and a
hidden-states backend that trains straight from our shards (:mod:`.backend`)."""
