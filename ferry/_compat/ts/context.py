from ferry.handlers.context import Context, RequestProcessor

__all__ = ["Context", "RequestProcessor"]
