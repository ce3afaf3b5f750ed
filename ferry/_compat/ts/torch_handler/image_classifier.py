from ferry.handlers.builtin.image_classifier import ImageClassifier

__all__ = ["ImageClassifier"]
