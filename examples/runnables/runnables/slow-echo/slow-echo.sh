#!/bin/sh
# slow-echo: POSIX shell only. The request is one JSON line on stdin; `"seconds":N` is the
# only member of the input, so a sed pattern finds it.
request=$(cat)
seconds=$(printf '%s' "$request" | sed -n 's/.*"seconds":\([0-9][0-9]*\).*/\1/p')
seconds=${seconds:-0}
echo "sleeping ${seconds}s" >&2
sleep "$seconds"
printf '{"ok":true,"output":{"slept":%s}}\n' "$seconds"
