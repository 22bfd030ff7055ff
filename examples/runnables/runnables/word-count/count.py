"""word-count: reads the request from stdin, writes one result document to stdout."""

import json
import sys

request = json.load(sys.stdin)
text = request["input"]["text"]
print(f"counting {len(text)} characters for intent {request['intent_id']}", file=sys.stderr)
result = {"words": len(text.split()), "characters": len(text)}
json.dump({"ok": True, "output": result}, sys.stdout)
