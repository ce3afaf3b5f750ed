from ferry.handlers.builtin.image_classifier import VisionHandler

__all__ = ["VisionHandler"]
