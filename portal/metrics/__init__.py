"""`/metrics` in Prometheus text format and the catalogue of its series."""
