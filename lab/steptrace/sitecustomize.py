# Put this folder on PYTHONPATH together with FASTVERIFY_STEP_TRACE=DIR to trace every iteration of
# each SGLang scheduler started from that environment (lab/steptrace/steptrace.py; lab/step_trace.py
# reads the files). Without that variable it does nothing.
import os

if os.environ.get("FASTVERIFY_STEP_TRACE"):
    from steptrace import install_import_hook  # this folder's steptrace.py

    install_import_hook()
