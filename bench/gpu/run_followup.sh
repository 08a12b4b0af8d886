#!/usr/bin/env bash
# The second, shorter device run: $OUT/{copy_followup,stack_followup}.json (see run_all.sh).
SET=followup exec bash "$(dirname "$0")/run_all.sh"
