"""protoc's modules for ferry/grpc/protos/*.proto, made by scripts/generate-grpc.sh; never
edited by hand (tests/unit/test_grpc_generated.py fails when they differ from a fresh run)."""
