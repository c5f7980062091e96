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
#   uid          the uid it runs as                              -> uid N
#   openw PATH   open a file for writing, writing nothing        -> openw-ok PATH | openw-denied PATH
#   addkey NAME  add a key to its user keyring                   -> addkey-ok NAME | addkey-failed NAME
#   findkey NAME look for a key in its user keyring              -> findkey-hit NAME | findkey-none NAME
#   forkbomb N   start up to N processes that stay, mark the workspace `forked`, wait for a
#                `release` file there                            -> forked STARTED of N
#   allocate MIB allocate and touch MIB MiB of memory            -> allocated MIB | allocate-failed MIB
#   fill MIB     write a file of MIB MiB in the workspace        -> filled MIB
#   flood MIB    write MIB files of 1 MiB each in the workspace, a tenth of a second apart (a
#                busy tool's pace, slower than the bound's measurements on any disk) -> flooded MIB
#   hold         wait (up to 90 s) for a `release` file in the workspace -> held
#   clean        remove the files fill and flood wrote           -> cleaned
#   fail CODE    end at once with exit status CODE               -> failing CODE
# add_key / keyctl(KEYCTL_SEARCH) on the user keyring, through the C library.
KEYS='
import ctypes, platform, sys
add_key, keyctl = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
libc = ctypes.CDLL(None)
verb, name = sys.argv[1], sys.argv[2].encode()
if verb == "addkey":
    found = libc.syscall(add_key, b"user", name, b"secret", 6, -4)
else:
    found = libc.syscall(keyctl, 10, -4, b"user", name, 0)
sys.exit(0 if found > 0 else 1)
'
# Children that stay until the turn ends, as many as the kernel allows, up to N.
FORKS='
import os, sys, time
wanted, started = int(sys.argv[1]), 0
while started < wanted:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    started += 1
open("forked", "w").close()
while not os.path.exists("release"):
    time.sleep(0.05)
print(f"forked {started} of {wanted}", flush=True)
'
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
    uid) echo "uid $(id -u)" ;;
    openw)
      if ( : >> "$arg" ) 2>/dev/null; then echo "openw-ok $arg"; else echo "openw-denied $arg"; fi ;;
    addkey|findkey)
      if python3 -c "$KEYS" "$verb" "$arg" 2>/dev/null; then
        [ "$verb" = addkey ] && echo "addkey-ok $arg" || echo "findkey-hit $arg"
      else
        [ "$verb" = addkey ] && echo "addkey-failed $arg" || echo "findkey-none $arg"
      fi ;;
    forkbomb) python3 -c "$FORKS" "$arg" ;;
    fill) head -c "$((arg * 1048576))" /dev/urandom > filled.bin && echo "filled $arg" ;;
    flood)
      n=0
      while [ "$n" -lt "$arg" ]; do
        n=$((n + 1))
        head -c 1048576 /dev/urandom > "flood-$n.bin"
        sleep 0.1
      done
      echo "flooded $arg" ;;
    hold)
      n=0
      while [ ! -e release ] && [ "$n" -lt 900 ]; do sleep 0.1; n=$((n + 1)); done
      echo "held" ;;
    clean) rm -f filled.bin flood-*.bin && echo "cleaned" ;;
    fail) echo "failing $arg"; exit "$arg" ;;
    allocate)
      if python3 -c "b = bytearray($arg * 1048576); print(len(b))" >/dev/null 2>&1; then
        echo "allocated $arg"
      else
        echo "allocate-failed $arg"
      fi ;;
    spawn)
      setsid sh -c 'sleep 600; :' "$arg" </dev/null >/dev/null 2>&1 &
      echo "spawned $arg" ;;
  esac
done
