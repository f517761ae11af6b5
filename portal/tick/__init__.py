"""The scheduling tick: snapshot the database, run the core, apply its decisions; and what rides on it (preview, estimates, what-if, reconcile)."""
