"""The consumer: GET / fetches a quote from `quotes` and checks that `greeter` answers."""
import http.server
import os
import signal
import socket
import sys
import urllib.request

QUOTES_URL = os.environ["QUOTES_URL"]
GREETER_HOST, GREETER_PORT = os.environ["GREETER_ADDR"].rsplit(":", 1)
PORT = int(os.environ["PORT"])


def greeter_reachable():
    try:
        socket.create_connection((GREETER_HOST, int(GREETER_PORT)), timeout=1).close()
        return True
    except OSError:
        return False


class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, status, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("content-type", "text/plain; charset=utf-8")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        if self.path == "/healthz":
            self.answer(200 if greeter_reachable() else 503, "ok\n")
            return
        try:
            with urllib.request.urlopen(QUOTES_URL + "/quote", timeout=2) as r:
                quote = r.read().decode().strip()
        except OSError as e:
            self.answer(502, f"quotes unavailable: {e}\n")
            return
        greeter = "reachable" if greeter_reachable() else "unreachable"
        self.answer(200, f"{quote}\n(quotes at {QUOTES_URL}, greeter at {GREETER_HOST}:{GREETER_PORT} {greeter})\n")

    def log_message(self, fmt, *args):
        print("frontend: " + fmt % args, flush=True)


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print(f"frontend: open http://127.0.0.1:{PORT}/", flush=True)
server.serve_forever()
