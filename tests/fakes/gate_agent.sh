#!/bin/sh
# A stand-in Agent for restart, outage and file tests. The prompt's first line (after the sender
# line a Feishu turn starts with) names a gate file:
# each run appends a line to GATE.runs, waits (up to 120 s) until GATE exists, then answers with
# its content, so a test decides when a turn ends and how often it ran. For each prompt line
# "- PATH (N bytes)" (a file the bot saved) it adds "saw PATH: <its first line>", and when
# GATE.out exists it leaves a copy in ./outbox/ for the bot to post.
# A Feishu turn's prompt starts with a line naming its sender; the gate is the first path.
IFS= read -r gate
case "$gate" in "Message from "*) IFS= read -r gate ;; esac
echo run >> "$gate.runs"
i=0
while [ ! -e "$gate" ]; do
  i=$((i + 1))
  [ "$i" -gt 1200 ] && exit 1
  sleep 0.1
done
cat "$gate"
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in
    "- "*" bytes)")
      path=${line#- }
      path=${path% (*}
      echo "saw $path: $(head -n 1 "$path")" ;;
  esac
done
if [ -e "$gate.out" ]; then
  mkdir -p outbox && cp "$gate.out" outbox/report.txt
fi
