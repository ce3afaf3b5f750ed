"""SageMaker's PyTorch serving contract (aws/sagemaker-pytorch-inference-toolkit), as the
built-in handler ``sagemaker_pytorch``: a model's ``code/inference.py`` functions, or the
toolkit's defaults (docs/sagemaker.md).

``codecs``: the default JSON / CSV / NPY formats; ``functions``: which functions serve a
model; ``defaults``: PyTorch's default functions; ``batching``: several requests through
one ``predict_fn`` call; ``handler``: ``SageMakerHandler``; ``toolkit`` and
``toolkit_handlers``: what ``sagemaker_inference`` and
``sagemaker_pytorch_serving_container`` give an ``inference.py`` (their import shims are
under ``ferry/_compat``).
"""
