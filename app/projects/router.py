"""REST routes of projects: parse, call one service function, return a schema."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.api.deps import AdminToken, AnyToken, OpsSession
from app.projects import service
from app.projects.schemas import ProjectCreate, ProjectOut

router = APIRouter(prefix="/projects", tags=["projects"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ProjectOut)
def create_project(body: ProjectCreate, session: OpsSession, _: AdminToken) -> ProjectOut:
    return ProjectOut.model_validate(service.create_project(session, body))


@router.get("", response_model=list[ProjectOut])
def list_projects(session: OpsSession, _: AnyToken) -> list[ProjectOut]:
    return [ProjectOut.model_validate(p) for p in service.list_projects(session)]


@router.get("/{name}", response_model=ProjectOut)
def get_project(name: str, session: OpsSession, _: AnyToken) -> ProjectOut:
    return ProjectOut.model_validate(service.get_project(session, name))


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_project(name: str, session: OpsSession, _: AdminToken) -> Response:
    service.delete_project(session, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
