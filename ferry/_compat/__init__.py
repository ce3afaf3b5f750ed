"""Import shims for handlers written for TorchServe, and for SageMaker's ``inference.py``.

This folder (``ferry.worker.loading.SHIM_ROOT``) is put on ``sys.path`` inside Ferry's
worker processes only (and only when no real ``ts`` package is installed), so
``import ts.torch_handler.base_handler`` works there without Ferry installing a top-level
``ts`` package into the user's environment. A SageMaker model's worker puts it there too
when ``sagemaker_inference`` or ``sagemaker_pytorch_serving_container`` is not installed
(``ferry.handlers.sagemaker.toolkit.add_shims``).
"""
