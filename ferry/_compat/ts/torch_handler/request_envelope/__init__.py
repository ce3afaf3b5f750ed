"""TorchServe compatibility: ``ts.torch_handler.request_envelope``.

Only ``base.BaseEnvelope``: Ferry decodes KServe and other protocols in its frontend.
"""
