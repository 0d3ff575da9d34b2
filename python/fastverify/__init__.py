"""sglang-fastverify: a fast verify step for speculative decoding in SGLang on
tensor-parallel machines."""

__version__ = "0.1.0"
