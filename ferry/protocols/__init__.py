"""Wire formats of the inference protocols Ferry speaks besides TorchServe's own, as plain
data: the Open Inference Protocol V2 (``v2``) and KServe V1 (``v1``). No transport here:
``ferry.http`` (and gRPC) adapters parse with these, call the service, and encode back."""
