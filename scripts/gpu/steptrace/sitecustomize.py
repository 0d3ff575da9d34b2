# Put this folder on PYTHONPATH together with FASTVERIFY_STEP_TRACE=DIR to trace every iteration of each
# SGLang scheduler started from that environment (python/fastverify/steptrace.py; benchmark/step_trace.py
# reads the files). Without the variable it does nothing.
import os

if os.environ.get("FASTVERIFY_STEP_TRACE"):
    from fastverify.steptrace import install_import_hook

    install_import_hook()
