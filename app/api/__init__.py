"""The REST API: a FastAPI app whose routers are thin over the domain services."""
