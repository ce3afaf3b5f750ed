"""What the transports serve: the transport-neutral model service and the workflows built
over it. The composition root (``ferry.server``) makes one of each and hands both to every
listener."""

from __future__ import annotations

from dataclasses import dataclass

from ferry.service import FerryService
from ferry.workflows.manager import WorkflowManager


@dataclass(frozen=True)
class Apis:
    service: FerryService
    workflows: WorkflowManager

    @classmethod
    def over(cls, service: FerryService) -> Apis:
        return cls(service, WorkflowManager(service))

    async def close(self) -> None:
        """Workflows first (they free their files), then the service stops every worker."""
        await self.workflows.close()
        await self.service.close()
