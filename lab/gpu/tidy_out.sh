#!/bin/bash
# What the GPU machine hands back from an evaluation's results folder is at most 8 files: keep there
# the summary, the timeline, the plots and the tarball, and move every other file into DEST (a
# folder that goes into the tarball):
#   bash lab/gpu/tidy_out.sh OUT DEST
# Prints a warning and exits 1 when more than 8 files are still left in OUT.
set -u
out=$1 dest=$2
keep='^(summary\.txt|summary\.json|timeline\.txt|evaluate\.tar\.xz|eval_.*\.png)$'
mkdir -p "$dest"
for f in "$out"/*; do
  [ -f "$f" ] || continue
  [[ $(basename "$f") =~ $keep ]] || mv -f "$f" "$dest/"
done
n=$(find "$out" -maxdepth 1 -type f | wc -l)
if [ "$n" -gt 8 ]; then
  echo "warning: $n files in $out, only 8 come back (the tarball has them all)"
  exit 1
fi
