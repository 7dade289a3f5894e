"""Celery workers, thin task wrappers, and the GPU runtime (the launcher)."""
