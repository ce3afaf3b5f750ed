from ferry.handlers.builtin.text_classifier import TextClassifier

__all__ = ["TextClassifier"]
