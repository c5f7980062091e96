#!/bin/sh
# A stand-in Agent that answers with its prompt (stdin), so a test reads what reached the Agent.
cat
