"""One-shot migration: create (or upgrade) the quotes database, then exit 0."""
import os
import sqlite3
import sys

path = os.environ["DB_PATH"]
os.makedirs(os.path.dirname(path), exist_ok=True)
db = sqlite3.connect(path)
db.execute("CREATE TABLE IF NOT EXISTS quotes (id INTEGER PRIMARY KEY, text TEXT NOT NULL UNIQUE)")
seed = [
    "Make it work, make it right, make it fast.",
    "Simplicity is prerequisite for reliability.",
    "The cheapest, fastest and most reliable components are those that aren't there.",
]
db.executemany("INSERT OR IGNORE INTO quotes (text) VALUES (?)", [(q,) for q in seed])
db.commit()
count = db.execute("SELECT COUNT(*) FROM quotes").fetchone()[0]
print(f"migrated {path}: {count} quotes", flush=True)
sys.exit(0)
