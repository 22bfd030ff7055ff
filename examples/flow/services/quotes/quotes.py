"""HTTP service: GET /quote answers a random quote from the migrated database."""
import http.server
import os
import random
import signal
import sqlite3
import sys

DB_PATH = os.environ["DB_PATH"]
PORT = int(os.environ["PORT"])  # set by the flow: this service has one endpoint


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
            try:
                sqlite3.connect(DB_PATH).execute("SELECT 1 FROM quotes LIMIT 1")
                self.answer(200, "ok\n")
            except sqlite3.Error as e:
                self.answer(503, f"database not ready: {e}\n")
        elif self.path == "/quote":
            rows = sqlite3.connect(DB_PATH).execute("SELECT text FROM quotes").fetchall()
            self.answer(200, random.choice(rows)[0] + "\n")
        else:
            self.answer(404, "try /quote\n")

    def log_message(self, fmt, *args):
        print("quotes: " + fmt % args, flush=True)


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print(f"quotes: serving http://127.0.0.1:{PORT}/quote", flush=True)
server.serve_forever()
