"""append-note: appends `<effect_id> <text>` to the notes file, then reports the count.

A note whose line already carries this effect_id is not appended again: a caller that retries
the same intent gets the same effect_id, so the handler can make its effect happen once.
"""

import json
import os
import sys

request = json.load(sys.stdin)
path = request["input"]["file"]
text = request["input"]["text"].replace("\n", " ")
effect_id = request["effect_id"]

if not os.path.isabs(path):
    json.dump({"ok": False, "error": {"code": "relative_path",
                                      "message": f"{path!r} is not an absolute path"}}, sys.stdout)
    sys.exit(0)

lines = []
if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
if not any(line.startswith(effect_id + " ") for line in lines):
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{effect_id} {text}\n")
    lines.append(f"{effect_id} {text}")
    print(f"appended a note for {effect_id}", file=sys.stderr)
else:
    print(f"{effect_id} was already applied; nothing appended", file=sys.stderr)
json.dump({"ok": True, "output": {"notes": len(lines)}}, sys.stdout)
