from ferry.handlers.builtin.base_handler import BaseHandler

__all__ = ["BaseHandler"]
