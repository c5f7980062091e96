#!/bin/sh
# A stand-in Agent that answers with its prompt (stdin), so a test reads what reached the Agent.
# A linked document saved as a file (a fence line's "file") is opened as an Agent would, from
# its working directory: the answer ends with the file's last line, which the prompt never holds.
awk '
{
    print
    rest = $0
    while (match(rest, /"file": "[^"]*"/)) {
        files[n++] = substr(rest, RSTART + 9, RLENGTH - 10)
        rest = substr(rest, RSTART + RLENGTH)
    }
}
END {
    for (i = 0; i < n; i++) {
        last = "(unreadable)"
        while ((getline line < files[i]) > 0) last = line
        close(files[i])
        print "Read " files[i] ", ending: " last
    }
}'
