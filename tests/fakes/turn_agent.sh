#!/bin/sh
# A stand-in Agent for the fair-share tests. Its prompt holds a line "turn LOG LABEL": the run
# appends LABEL to LOG (so LOG lists turns in the order they started), waits (up to 120 s) until
# LOG.LABEL or LOG.all exists, then answers "done LABEL".
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in
    "turn "*) set -- $line; log=$2; label=$3 ;;
  esac
done
[ -n "$log" ] || exit 2
echo "$label" >> "$log"
i=0
while [ ! -e "$log.$label" ] && [ ! -e "$log.all" ]; do
  i=$((i + 1))
  [ "$i" -gt 1200 ] && exit 1
  sleep 0.1
done
echo "done $label"
