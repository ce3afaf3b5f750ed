"""The built-in handlers: ``BaseHandler`` and the vision and text handlers built on it."""
