"""AWS's ``sagemaker_pytorch_serving_container`` (sagemaker-pytorch-inference-toolkit) as
an ``inference.py`` imports it, served by Ferry: ``default_pytorch_inference_handler``."""
