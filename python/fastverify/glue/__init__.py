"""Glue between patched SGLang and the fastverify library: the only modules
that touch SGLang objects.

One module per concern, each called from the seams of its patch. Each reads its flags once into a
frozen config and calls the library: the n-gram verify modules (``ngram``, ``verify_runtime``,
``auto``) all read ``config.verify_config(args)``, one ``NgramVerifyConfig`` per args object (the
mode, its verify shape, k, the widths, the auto settings); ``timing_hook``, ``nccl_hook``,
``allreduce_hook`` and ``emulator_hook`` build theirs from the flags they own.
"""
