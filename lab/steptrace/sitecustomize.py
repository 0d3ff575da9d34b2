# Put this folder on PYTHONPATH together with FASTVERIFY_STEP_TRACE=DIR to trace every iteration of each
# SGLang scheduler started from that environment (lab/steptrace/steptrace.py; lab/step_trace.py
# reads the files), and/or FASTVERIFY_SCHED_CPUS=a,b to pin each TP rank's scheduler thread to a CPU
# (python/fastverify/affinity.py). Without either variable it does nothing.
import os

if os.environ.get("FASTVERIFY_STEP_TRACE"):
    from steptrace import install_import_hook  # this folder's steptrace.py

    install_import_hook()
if os.environ.get("FASTVERIFY_SCHED_CPUS"):
    from fastverify.affinity import install_import_hook as install_affinity_hook

    install_affinity_hook()
