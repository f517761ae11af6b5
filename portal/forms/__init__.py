"""Forms validate and convert input; services decide and write."""
