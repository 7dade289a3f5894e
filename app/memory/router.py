"""REST routes of research memory (filled by the memory issue)."""

from fastapi import APIRouter

router = APIRouter(prefix="/memory", tags=["memory"])
