from ferry.handlers.contract.context import Context, RequestProcessor

__all__ = ["Context", "RequestProcessor"]
