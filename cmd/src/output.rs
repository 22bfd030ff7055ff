//! The one place `hostd` speaks to its user (the `flow` and `runnable` subcommands still write
//! their own lines), and the one table printer every family uses ([`Table`]).
//! Data — what a script would parse — goes to stdout, as human lines or, with `--json`, JSON:
//! a command that streams events (`watch`, `journal`) prints one JSON value per line, every
//! other command prints exactly one JSON document. Diagnostics (notes, warnings, errors,
//! progress) go to stderr; under `--json` an error is one JSON object
//! `{"error": {"code": ..., "message": ...}}` on one line. Colour and progress lines are used
//! only when stderr is a terminal (colour also never with `NO_COLOR`). A write to a closed pipe
//! (`hostd session ls | head -1`) surfaces as [`ClosedPipe`], which ends the command quietly
//! with success instead of a panic. Never prints a secret: callers pass only what may be shown.

use std::fmt::Display;
use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

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

/// How an actor (who admitted, answered, started or drained something) reads in human output:
/// the recorded name, or `unknown` where the store holds none (a record written before it kept
/// one, or by a caller that named nobody). Never a guess. JSON shows the same as `null`.
pub fn actor_text(actor: Option<&str>) -> &str {
    actor.unwrap_or("unknown")
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
    progress: bool,
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
        let terminal = io::stderr().is_terminal();
        Output {
            format: if json { Format::Json } else { Format::Human },
            colour_stderr: colour_for(terminal),
            progress: terminal,
            json_diagnostics: false,
        }
    }

    /// Diagnostics as JSON objects (`--log-format json`), never coloured and with no progress
    /// lines, so every line on stderr stays one JSON object.
    pub fn with_json_diagnostics(mut self, on: bool) -> Output {
        self.json_diagnostics = on;
        if on {
            self.colour_stderr = false;
            self.progress = false;
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

    /// A table on stdout (its lines end in line breaks of their own).
    pub fn table(&self, table: &Table) -> anyhow::Result<()> {
        let mut out = io::stdout().lock();
        out.write_all(table.render().as_bytes()).map_err(pipe)
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

    /// An error with its stable code: one JSON object on one line under `--json` (with
    /// `extra` members such as the command id beside code and message), else a line.
    pub fn coded_error(&self, code: &str, message: &str, extra: &[(&str, &str)]) {
        if self.is_json() {
            let mut error = serde_json::Map::new();
            error.insert("code".into(), Value::from(code));
            error.insert("message".into(), Value::from(message));
            for (k, v) in extra {
                error.insert((*k).into(), Value::from(*v));
            }
            let mut err = io::stderr().lock();
            let _ = writeln!(err, "{}", serde_json::json!({ "error": error }));
        } else {
            self.error(format_args!("{message} [{code}]"));
        }
    }

    /// A progress line on a terminal's stderr, replacing the previous one; nothing otherwise.
    pub fn progress(&self, text: impl Display) {
        if self.progress {
            let mut err = io::stderr().lock();
            let _ = write!(err, "\r\x1b[2Khostd: {text}");
            let _ = err.flush();
        }
    }

    /// Clears the progress line, if one is shown.
    pub fn end_progress(&self) {
        if self.progress {
            let mut err = io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A table for a person to read: a header line, then one line per row. Each column is as wide
/// as its widest cell, its header or its least width, whichever is widest (counted in
/// characters); cells are apart by the gap (2 spaces unless told); the last column is not
/// padded unless it aligns right, and no line ends in blanks. Under `--json` a caller prints
/// its rows as data instead: the table is text only.
#[derive(Clone, Debug)]
pub struct Table {
    headers: Vec<String>,
    least: Vec<usize>,
    align: Vec<Align>,
    gap: usize,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            least: vec![0; headers.len()],
            align: vec![Align::Left; headers.len()],
            gap: 2,
            rows: Vec::new(),
        }
    }

    /// The spaces between two cells.
    pub fn gap(mut self, spaces: usize) -> Table {
        self.gap = spaces;
        self
    }

    /// Column `column` is at least `width` characters wide.
    pub fn least_width(mut self, column: usize, width: usize) -> Table {
        if let Some(w) = self.least.get_mut(column) {
            *w = width;
        }
        self
    }

    /// Column `column` aligns right.
    pub fn right(mut self, column: usize) -> Table {
        if let Some(a) = self.align.get_mut(column) {
            *a = Align::Right;
        }
        self
    }

    /// Adds a row (a missing cell is empty; a cell past the last column is dropped).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut row: Vec<String> = cells
            .into_iter()
            .take(self.headers.len())
            .map(Into::into)
            .collect();
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
    }

    /// Adds every row.
    pub fn rows<R, S>(mut self, rows: impl IntoIterator<Item = R>) -> Table
    where
        R: IntoIterator<Item = S>,
        S: Into<String>,
    {
        for r in rows {
            self.row(r);
        }
        self
    }

    /// The header and every row, each line ending in a line break.
    pub fn render(&self) -> String {
        let width = |s: &str| s.chars().count();
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| width(&r[i]))
                    .chain([width(&self.headers[i]), self.least[i]])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let last = self.headers.len().saturating_sub(1);
        let line = |cells: &[String]| {
            let mut text = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    text.push_str(&" ".repeat(self.gap));
                }
                let pad = " ".repeat(widths[i].saturating_sub(width(cell)));
                match self.align[i] {
                    Align::Right => {
                        text.push_str(&pad);
                        text.push_str(cell);
                    }
                    Align::Left if i == last => text.push_str(cell),
                    Align::Left => {
                        text.push_str(cell);
                        text.push_str(&pad);
                    }
                }
            }
            let mut text = text.trim_end().to_owned();
            text.push('\n');
            text
        };
        let mut out = line(&self.headers);
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

impl Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

/// A wait that shows, on a terminal only, what it waits for and for how long (once a second,
/// after the first second); the line is cleared when the wait ends.
pub struct Progress<'a> {
    out: &'a Output,
    what: String,
    bound: Duration,
    started: Instant,
    shown: Option<u64>,
}

impl<'a> Progress<'a> {
    pub fn new(out: &'a Output, what: impl Into<String>, bound: Duration) -> Progress<'a> {
        Progress {
            out,
            what: what.into(),
            bound,
            started: Instant::now(),
            shown: None,
        }
    }

    /// Updates the line if a new second has passed.
    pub fn tick(&mut self) {
        let secs = self.started.elapsed().as_secs();
        if secs >= 1 && self.shown != Some(secs) {
            self.shown = Some(secs);
            self.out
                .progress(progress_text(&self.what, secs, self.bound));
        }
    }
}

impl Drop for Progress<'_> {
    fn drop(&mut self) {
        if self.shown.is_some() {
            self.out.end_progress();
        }
    }
}

fn progress_text(what: &str, secs: u64, bound: Duration) -> String {
    format!("{what} ({secs} s of {} s)", bound.as_secs())
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
    fn a_progress_line_says_what_is_awaited_and_for_how_long() {
        let text = progress_text(
            "waiting for command c-1 to be applied",
            3,
            Duration::from_secs(60),
        );
        assert_eq!(text, "waiting for command c-1 to be applied (3 s of 60 s)");
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
    fn a_table_aligns_its_columns_to_the_widest_cell_and_leaves_no_trailing_blanks() {
        let t = Table::new(&["NAME", "N", "NOTE"])
            .right(1)
            .rows([["alpha", "7", "first"], ["b", "1234", ""]]);
        assert_eq!(
            t.render(),
            "NAME      N  NOTE\nalpha     7  first\nb      1234\n"
        );
    }

    #[test]
    fn a_table_keeps_a_columns_least_width_and_its_gap_and_counts_characters() {
        let t = Table::new(&["ID", "KIND", "PROMPT"])
            .gap(1)
            .least_width(0, 6)
            .rows([["é…", "x", "ask"]]);
        assert_eq!(t.render(), "ID     KIND PROMPT\né…     x    ask\n");
    }

    #[test]
    fn colour_needs_a_terminal() {
        assert!(!colour_for(false));
    }
}
