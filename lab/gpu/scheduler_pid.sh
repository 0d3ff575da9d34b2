#!/bin/bash
# The TP-0 scheduler process of a server whose processes share the process group PGID:
#   bash lab/gpu/scheduler_pid.sh PGID
# SGLang names it "sglang::scheduler" at TP=1 and "sglang::scheduler_TP0" with more ranks (DP, PP
# and EP parts may come before and after TP0; setproctitle in run_scheduler_process). Prints
# nothing where none runs.
ps -eo pid=,pgid=,args= | awk -v g="$1" '
  $2 == g && $0 ~ /(^| )sglang::scheduler(_[A-Z_0-9]*)?( |$)/ && $0 !~ /_TP[1-9]/ {print $1; exit}'
