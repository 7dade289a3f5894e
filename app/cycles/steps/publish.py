"""publishing → awaiting_review: push the branch, open (or find) the pull request, and record
the verdict and the agent's lessons as *proposed* findings: a reviewer's approval validates."""

from __future__ import annotations

from app.cycles import repository, service
from app.cycles.exceptions import Transient
from app.cycles.headline import ratio_text, verdict_statement
from app.cycles.models import Cycle
from app.cycles.pull_request import links, pr_body, pr_title
from app.cycles.steps.base import Step
from app.errors import Unavailable
from app.forge import service as forge_service
from app.forge.base import ProjectRef
from app.memory import service as memory
from app.memory.exceptions import FindingExists
from app.memory.schemas import Evidence, FindingCreate
from app.reports import cycle as report


class Publish(Step):
    FROM_STATES = ("publishing",)
    TO_STATES = ("awaiting_review",)

    def run(self, cycle_id: int) -> bool:
        forge = forge_service.forge_for(self.settings, self.stores)
        cycle, ref, gpu_kind, result = self.judged(cycle_id)
        branch = self.branch(cycle, ref, forge)
        try:
            where = links(cycle, ref, forge, self.settings.dashboard_base_url)
            pr = forge_service.publish(
                self.git(),
                forge,
                ref,
                branch,
                str(cycle.id),
                title=pr_title(cycle),
                body=pr_body(cycle, ref, result, where),
            )
        except Unavailable as exc:
            raise Transient(exc.detail) from exc
        forge_service.show_verdict(
            forge,
            ref,
            pr.head_sha,
            cycle.verdict,
            f"{cycle.verdict or 'no verdict'}: {ratio_text(cycle.headline)}",
            where.dashboard,
        )
        finding_ids = self._record_findings(cycle, ref, gpu_kind, pr.url)
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            cycle.pr_number, cycle.pr_url, cycle.finding_ids = pr.number, pr.url, finding_ids
            repository.set_state(session, cycle, "awaiting_review")
        return True

    def _record_findings(
        self, cycle: Cycle, project: ProjectRef, device_kind: str, pr_url: str
    ) -> list[str]:
        evidence = Evidence(
            cycle_id=str(cycle.id),
            commit=cycle.commit_sha,
            pr_url=pr_url,
            result_path=f"{report.results_dir(str(cycle.id))}/result.json",
        )
        lessons = list((cycle.proposal or {}).get("proposed_lessons") or [])
        drafts = [
            FindingCreate(
                project=project.name,
                kind="verdict",
                statement=verdict_statement(cycle),
                hypothesis=cycle.hypothesis,
                fingerprint=cycle.fingerprint,
                device_kind=device_kind,
                scope={"parameters": cycle.parameters or {}},
                metrics=cycle.headline or {},
                source=pr_url,
                source_status="verified",
                evidence=evidence,
                tags=["autopilot", str(cycle.experiment)],
            ),
            *(
                FindingCreate(
                    project=project.name,
                    kind="lesson",
                    statement=text,
                    device_kind=device_kind,
                    source=pr_url,
                    source_status="verified",
                    evidence=evidence,
                )
                for text in lessons
            ),
        ]
        ids: list[str] = []
        with self.stores.memory_session() as msession:
            for draft in drafts:
                try:
                    ids.append(memory.create(msession, draft, actor=f"cycle-{cycle.id}").id)
                except FindingExists as exc:  # recorded before a crash: look it up, not again
                    ids.append(str(exc.extra.get("finding_id")))
        return ids
