"""AWS's ``sagemaker_inference`` (sagemaker-inference-toolkit) as an ``inference.py``
imports it, served by Ferry: ``content_types``, ``decoder``, ``encoder``, ``errors``,
``utils`` and ``default_inference_handler`` (``ferry.handlers.sagemaker.toolkit``)."""
