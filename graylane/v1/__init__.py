"""Generated protobuf contracts of graylane.v1 (do not edit; see protos/generate.py)."""
