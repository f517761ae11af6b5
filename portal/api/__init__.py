"""The REST API under /api/v1/: one APIView per operation, grouped by noun."""
