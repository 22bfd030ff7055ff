//! Per-service log files: one line per output line, stamped with the time and the stream,
//! plus merged reading and following across services.
//!
//! This module owns the log line format and the files under the state folder's `logs/`. It
//! must never interpret what a service printed.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// The stream tag of a line the supervisor itself wrote (start, exit, restart).
pub const FLOW_STREAM: &str = "flow";

/// One line of a service's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub service: String,
    /// RFC 3339 with milliseconds, UTC; sorts as text.
    pub timestamp: String,
    pub stream: String,
    pub text: String,
}

impl LogLine {
    fn parse(service: &str, line: &str) -> Option<LogLine> {
        let (timestamp, rest) = line.split_once(' ')?;
        let (stream, text) = rest.split_once(' ').unwrap_or((rest, ""));
        Some(LogLine {
            service: service.to_owned(),
            timestamp: timestamp.to_owned(),
            stream: stream.to_owned(),
            text: text.to_owned(),
        })
    }
}

/// Appends stamped lines to one service's log file.
#[derive(Debug)]
pub struct LogWriter {
    path: PathBuf,
    file: Mutex<BufWriter<File>>,
}

impl LogWriter {
    /// Opens `path` for appending, creating it (and its folder) when missing.
    pub fn open(path: &Path) -> io::Result<LogWriter> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(LogWriter {
            path: path.to_path_buf(),
            file: Mutex::new(BufWriter::new(file)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one line; a failure to write the log never stops the service, it is traced.
    pub fn write(&self, stream: &str, text: &str) {
        let stamp = humantime::format_rfc3339_millis(SystemTime::now());
        let Ok(mut file) = self.file.lock() else {
            return;
        };
        let result = writeln!(file, "{stamp} {stream} {text}").and_then(|_| file.flush());
        if let Err(e) = result {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot write a service log line");
        }
    }
}

/// Every line of one service's log.
pub fn read_service(path: &Path, service: &str) -> io::Result<Vec<LogLine>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for line in BufReader::new(file).split(b'\n') {
        let line = line?;
        if let Some(parsed) = LogLine::parse(service, &String::from_utf8_lossy(&line)) {
            out.push(parsed);
        }
    }
    Ok(out)
}

/// The lines of several services' logs, merged in time order (stable for equal stamps).
pub fn read_merged(files: &[(String, PathBuf)]) -> io::Result<Vec<LogLine>> {
    let mut all = Vec::new();
    for (service, path) in files {
        all.extend(read_service(path, service)?);
    }
    all.sort_by(|a, b| a.timestamp.cmp(&b.timestamp));
    Ok(all)
}

/// Follows several log files from their current end (or from the start) and returns the
/// complete lines appended since the last poll, merged in time order.
#[derive(Debug)]
pub struct LogFollower {
    files: Vec<Followed>,
}

#[derive(Debug)]
struct Followed {
    service: String,
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl LogFollower {
    /// Starts after the lines that exist now.
    pub fn from_end(files: &[(String, PathBuf)]) -> LogFollower {
        LogFollower {
            files: files
                .iter()
                .map(|(service, path)| Followed {
                    service: service.clone(),
                    path: path.clone(),
                    offset: fs::metadata(path).map(|m| m.len()).unwrap_or(0),
                    partial: Vec::new(),
                })
                .collect(),
        }
    }

    pub fn poll(&mut self) -> io::Result<Vec<LogLine>> {
        let mut out = Vec::new();
        for f in &mut self.files {
            let mut file = match File::open(&f.path) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let len = file.metadata()?.len();
            if len < f.offset {
                // Truncated by a new `up`: start over.
                f.offset = 0;
                f.partial.clear();
            }
            file.seek(SeekFrom::Start(f.offset))?;
            let mut buf = Vec::new();
            file.read_to_end(&mut buf)?;
            f.offset += buf.len() as u64;
            f.partial.extend_from_slice(&buf);
            while let Some(pos) = f.partial.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = f.partial.drain(..=pos).collect();
                let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
                if let Some(parsed) = LogLine::parse(&f.service, &text) {
                    out.push(parsed);
                }
            }
        }
        out.sort_by(|a, b| a.timestamp.cmp(&b.timestamp));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_stamped_and_merged_across_services_in_time_order() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.log");
        let b = dir.path().join("b.log");
        let wa = LogWriter::open(&a).unwrap();
        let wb = LogWriter::open(&b).unwrap();
        wa.write("out", "first");
        std::thread::sleep(std::time::Duration::from_millis(3));
        wb.write("err", "second with  spaces");
        std::thread::sleep(std::time::Duration::from_millis(3));
        wa.write("out", "third");
        let merged = read_merged(&[("a".into(), a.clone()), ("b".into(), b.clone())]).unwrap();
        let texts: Vec<(&str, &str, &str)> = merged
            .iter()
            .map(|l| (l.service.as_str(), l.stream.as_str(), l.text.as_str()))
            .collect();
        assert_eq!(
            texts,
            vec![
                ("a", "out", "first"),
                ("b", "err", "second with  spaces"),
                ("a", "out", "third")
            ]
        );
    }

    #[test]
    fn a_follower_returns_only_new_complete_lines() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.log");
        let w = LogWriter::open(&a).unwrap();
        w.write("out", "old");
        let mut follower = LogFollower::from_end(&[("a".into(), a.clone())]);
        assert!(follower.poll().unwrap().is_empty());
        w.write("out", "new");
        let lines = follower.poll().unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].text, "new");
    }
}
