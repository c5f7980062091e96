#!/bin/sh
# A stand-in Agent for restart and outage tests. The prompt's first line names a gate file: each
# run appends a line to GATE.runs, waits (up to 120 s) until GATE exists, then answers with its
# content, so a test decides when a turn ends and how often it ran.
IFS= read -r gate
echo run >> "$gate.runs"
i=0
while [ ! -e "$gate" ]; do
  i=$((i + 1))
  [ "$i" -gt 1200 ] && exit 1
  sleep 0.1
done
cat "$gate"
