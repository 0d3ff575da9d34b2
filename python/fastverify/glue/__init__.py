"""Glue between patched SGLang and the fastverify library: the only modules that touch SGLang objects.

One module per concern; each reads SGLang's flags once, builds a frozen config and calls the library.
"""
