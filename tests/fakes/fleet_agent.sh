#!/bin/sh
# A stand-in Agent for the worker-fleet test. Its prompt holds a line "turn LOG LABEL". Each run
# appends "LABEL PID WORKDIR" to LOG as it starts (a retry's run too, and its working directory
# names the worker that launched it), waits (up to 120 s) until LOG.LABEL or LOG.all exists,
# appends "LABEL PID end", then answers "done LABEL PID": a result names the run that made it.
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in
    "turn "*) set -- $line; log=$2; label=$3 ;;
  esac
done
[ -n "$log" ] || exit 2
echo "$label $$ $PWD" >> "$log"
i=0
while [ ! -e "$log.$label" ] && [ ! -e "$log.all" ]; do
  i=$((i + 1))
  [ "$i" -gt 1200 ] && exit 1
  sleep 0.1
done
echo "$label $$ end" >> "$log"
echo "done $label $$"
