"""Reads for pages and the API: querysets and plain rows, never a write."""
