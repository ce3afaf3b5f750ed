from ferry.handlers.base_handler import BaseHandler

__all__ = ["BaseHandler"]
