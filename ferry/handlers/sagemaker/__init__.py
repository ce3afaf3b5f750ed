"""SageMaker's PyTorch serving contract (aws/sagemaker-pytorch-inference-toolkit), as the
built-in handler ``sagemaker_pytorch``: a model's ``code/inference.py`` functions, or the
toolkit's defaults (docs/sagemaker.md).

``codecs``: the default JSON / CSV / NPY formats; ``functions``: which functions serve a
model; ``defaults``: PyTorch's default functions; ``handler``: ``SageMakerHandler``.
"""
