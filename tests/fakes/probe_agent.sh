#!/bin/sh
# A stand-in Agent shell for the sandbox tests: it does what a prompt-injected Agent would and
# reports, one line each, what worked. Commands arrive on stdin (the prompt), one per line:
#   nonce X      echo X back (proves this probe really ran)
#   read PATH    try to read a file             -> read-ok PATH | read-denied PATH
#   list PATH    try to list a directory        -> list-ok PATH | list-empty PATH
#   write NAME   write a file in the workspace  -> wrote NAME
#   cwd          the workspace and its entries  -> cwd DIR: ENTRIES
#   environ X    search every visible process environment for X -> environ-hit | environ-none
#   spawn TAG    leave a detached process behind, tagged TAG     -> spawned TAG
while IFS= read -r line; do
  verb=${line%% *}
  arg=${line#* }
  case "$verb" in
    nonce) echo "nonce $arg" ;;
    read)
      if cat "$arg" >/dev/null 2>&1; then echo "read-ok $arg"; else echo "read-denied $arg"; fi ;;
    list)
      if [ -n "$(ls -A "$arg" 2>/dev/null)" ]; then echo "list-ok $arg"; else echo "list-empty $arg"; fi ;;
    write)
      mkdir -p "$(dirname "$arg")" && echo "left by another Agent" > "$arg" && echo "wrote $arg" ;;
    cwd) echo "cwd $(pwd): $(ls -A | tr '\n' ' ')" ;;
    environ)
      if grep -q -s -a -F "$arg" /proc/[0-9]*/environ; then
        echo "environ-hit"
      else
        echo "environ-none"
      fi ;;
    spawn)
      setsid sh -c 'sleep 600; :' "$arg" </dev/null >/dev/null 2>&1 &
      echo "spawned $arg" ;;
  esac
done
