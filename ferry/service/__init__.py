"""The transport-neutral service every transport calls: ``FerryService`` (``front``) over
the model lifecycle (``lifecycle``), with the types its calls take and return (``types``)."""

from ferry.service.front import FerryService

__all__ = ["FerryService"]
