"""Forge tables in the ops DB (filled by the forge issue)."""
