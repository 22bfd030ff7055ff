//! The one place `hostd` speaks to its user (the `flow` subcommand still writes on its own).
//! Data — what a script would parse — goes to stdout, as human lines or, with `--json`, one
//! JSON value per line; diagnostics (notes, warnings, errors, progress) go to stderr. Colour is
//! used only when the stream is a terminal and `NO_COLOR` is unset. A write to a closed pipe
//! (`hostd session ls | head -1`) surfaces as [`ClosedPipe`], which ends the command quietly
//! with success instead of a panic. Never prints a secret: callers pass only what may be shown.

use std::fmt::Display;
use std::io::{self, IsTerminal, Write};

use serde_json::Value;

/// The reader of stdout went away; the command ends quietly.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed")]
pub struct ClosedPipe;

/// True when `e` (anywhere in its chain) is a closed stdout.
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<ClosedPipe>()
            || c.downcast_ref::<io::Error>()
                .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// How data is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Human,
    Json,
}

/// The output of one `hostd` invocation.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    format: Format,
    colour_stderr: bool,
    /// With `--log-format json`, diagnostics are JSON objects shaped like the log lines, so
    /// every line on stderr is one JSON object.
    json_diagnostics: bool,
}

/// Colour only on a terminal, and never when `NO_COLOR` is set to anything non-empty.
fn colour_for(terminal: bool) -> bool {
    terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn pipe(e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        ClosedPipe.into()
    } else {
        e.into()
    }
}

impl Output {
    pub fn new(json: bool) -> Output {
        Output {
            format: if json { Format::Json } else { Format::Human },
            colour_stderr: colour_for(io::stderr().is_terminal()),
            json_diagnostics: false,
        }
    }

    /// Diagnostics as JSON objects (`--log-format json`), never coloured.
    pub fn with_json_diagnostics(mut self, on: bool) -> Output {
        self.json_diagnostics = on;
        if on {
            self.colour_stderr = false;
        }
        self
    }

    pub fn is_json(&self) -> bool {
        self.format == Format::Json
    }

    /// Whether diagnostics on stderr may be coloured (also used for the log lines).
    pub fn colour_stderr(&self) -> bool {
        self.colour_stderr
    }

    /// One line of data on stdout.
    pub fn line(&self, text: impl Display) -> anyhow::Result<()> {
        let mut out = io::stdout().lock();
        writeln!(out, "{text}").map_err(pipe)
    }

    /// One record: `human` as a line, or `json()` as one JSON value per line.
    pub fn record(&self, human: impl Display, json: impl FnOnce() -> Value) -> anyhow::Result<()> {
        match self.format {
            Format::Human => self.line(human),
            Format::Json => self.line(json()),
        }
    }

    /// Text without a line break, shown at once (live previews).
    pub fn partial(&self, text: &str) -> anyhow::Result<()> {
        let mut out = io::stdout().lock();
        out.write_all(text.as_bytes()).map_err(pipe)?;
        out.flush().map_err(pipe)
    }

    fn diagnostic(&self, label: &str, level: &str, colour: &str, text: impl Display) {
        let mut err = io::stderr().lock();
        let _ = if self.json_diagnostics {
            writeln!(err, "{}", json_diagnostic(level, &text.to_string()))
        } else if self.colour_stderr {
            writeln!(err, "\x1b[{colour}mhostd: {label}\x1b[0m{text}")
        } else {
            writeln!(err, "hostd: {label}{text}")
        };
    }

    /// A note for the user on stderr.
    pub fn note(&self, text: impl Display) {
        self.diagnostic("", "INFO", "1", text);
    }

    /// A warning on stderr.
    pub fn warn(&self, text: impl Display) {
        self.diagnostic("warning: ", "WARN", "33", text);
    }

    /// An error on stderr.
    pub fn error(&self, text: impl Display) {
        self.diagnostic("error: ", "ERROR", "31", text);
    }
}

/// One diagnostic as the JSON log formatter shapes an event: timestamp, level, the message
/// under `fields`, and the target.
fn json_diagnostic(level: &str, message: &str) -> Value {
    serde_json::json!({
        "timestamp": humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
        "level": level,
        "fields": { "message": message },
        "target": "hostd",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_pipe_anywhere_in_the_chain_is_a_closed_pipe() {
        let e = anyhow::Error::from(io::Error::from(io::ErrorKind::BrokenPipe)).context("listing");
        assert!(is_closed_pipe(&e));
        assert!(is_closed_pipe(&anyhow::Error::from(ClosedPipe)));
        let other = anyhow::Error::from(io::Error::from(io::ErrorKind::NotFound));
        assert!(!is_closed_pipe(&other));
    }

    #[test]
    fn a_json_diagnostic_is_one_line_of_one_object() {
        let v = json_diagnostic("WARN", "two\nlines \"quoted\"");
        let line = v.to_string();
        assert!(!line.contains('\n'), "{line}");
        let back: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["level"], "WARN");
        assert_eq!(back["fields"]["message"], "two\nlines \"quoted\"");
    }

    #[test]
    fn colour_needs_a_terminal() {
        assert!(!colour_for(false));
    }
}
