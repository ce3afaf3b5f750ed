from ferry.handlers.image_classifier import ImageClassifier

__all__ = ["ImageClassifier"]
