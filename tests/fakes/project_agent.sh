#!/bin/sh
# A stand-in Agent for project turns, run in its conversation's checkout. Prompt lines:
#   write NAME TEXT   writes TEXT (one line) to NAME in the checkout
#   sparse NAME SIZE  makes NAME a sparse file of SIZE (truncate -s): no disk, all holes
#   fill NAME SIZE    writes SIZE bytes of text lines to NAME
#   hold              touches .held, waits (up to 120 s) until .open exists, removes both
#   try PATH          tries to create PATH and answers "reached PATH" or "refused PATH"
#   show PATH         answers with PATH's content, or "unreadable PATH"
#   env               answers with its whole environment
#   git ARGS...       runs git ARGS in the checkout and answers with what it said
#   - inbox/... (N bytes)  a file the chat sent, as the bot names it: answers with its content
# Then it runs git in the checkout and answers with its branch and last commit's subject.
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in
    "write "*)
      set -- $line
      name=$2; shift 2
      mkdir -p "$(dirname "$name")" && echo "$*" > "$name" ;;
    "sparse "*)
      set -- $line
      truncate -s "$3" "$2" ;;
    "fill "*)
      set -- $line
      yes "a line of text" | head -c "$3" > "$2" ;;
    hold)
      touch .held
      i=0
      while [ ! -e .open ]; do
        i=$((i + 1))
        [ "$i" -gt 1200 ] && exit 1
        sleep 0.1
      done
      rm -f .held .open ;;
    "try "*)
      path=${line#try }
      if (echo planted > "$path") 2>/dev/null; then echo "reached $path"; else echo "refused $path"; fi ;;
    "show "*)
      path=${line#show }
      cat "$path" 2>/dev/null || echo "unreadable $path" ;;
    env) env ;;
    "git "*)
      set -- $line
      shift
      git "$@" 2>&1 || echo "git $1 failed" ;;
    "- inbox/"*)
      path=${line#- }
      path=${path% (*}
      echo "attached $path: $(cat "$path" 2>/dev/null || echo unreadable)" ;;
  esac
done
echo "on $(git branch --show-current) after: $(git log -1 --format=%s)"
