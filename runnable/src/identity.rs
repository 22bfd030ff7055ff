//! Runnable identity: `workspace/name@version`, the rule its parts follow, and the references a
//! user types (`name`, `name@version`, `workspace/name@version`).
//!
//! This module owns the text rules only. It must never look anything up: resolving a
//! reference against what exists is the catalog's job.

use std::cmp::Ordering;
use std::fmt;

/// The longest name, version or workspace name accepted.
pub const MAX_PART_LEN: usize = 128;

/// One release of a runnable: the workspace it was declared in, its name and its version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    pub workspace: String,
    pub name: String,
    pub version: String,
}

impl Identity {
    /// `name@version`, without the workspace.
    pub fn release(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}@{}", self.workspace, self.name, self.version)
    }
}

/// Checks one part of an identity. The rule: 1 to 128 characters; no `/`, `@`, whitespace or
/// control character; not starting with `.` or `-`. So `workspace/name@version` always splits
/// back into exactly the parts it was made of, and a part is always a safe file name.
pub fn check_part(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err("is empty".into());
    }
    if text.chars().count() > MAX_PART_LEN {
        return Err(format!("is longer than {MAX_PART_LEN} characters"));
    }
    if let Some(c) = text
        .chars()
        .find(|c| *c == '/' || *c == '@' || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "`{text}` contains {}; names and versions may not contain `/`, `@`, whitespace or control characters",
            match c {
                '/' => "`/`".to_owned(),
                '@' => "`@`".to_owned(),
                c if c.is_whitespace() => "whitespace".to_owned(),
                _ => "a control character".to_owned(),
            }
        ));
    }
    if text.starts_with('.') || text.starts_with('-') {
        return Err(format!("`{text}` may not start with `.` or `-`"));
    }
    Ok(())
}

/// What a user typed to name a runnable: `name`, `name@version` or `workspace/name@version`
/// (`workspace/name` too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub workspace: Option<String>,
    pub name: String,
    pub version: Option<String>,
}

impl Reference {
    /// Parses a reference, refusing any part that breaks [`check_part`].
    pub fn parse(text: &str) -> Result<Reference, String> {
        let (workspace, rest) = match text.split_once('/') {
            Some((w, rest)) => (Some(w), rest),
            None => (None, text),
        };
        let (name, version) = match rest.split_once('@') {
            Some((n, v)) => (n, Some(v)),
            None => (rest, None),
        };
        if let Some(w) = workspace {
            check_part(w).map_err(|e| format!("the workspace in `{text}` {e}"))?;
        }
        check_part(name).map_err(|e| format!("the name in `{text}` {e}"))?;
        if let Some(v) = version {
            check_part(v).map_err(|e| format!("the version in `{text}` {e}"))?;
        }
        Ok(Reference {
            workspace: workspace.map(str::to_owned),
            name: name.to_owned(),
            version: version.map(str::to_owned),
        })
    }

    /// Whether `identity` is one this reference could mean.
    pub fn matches(&self, identity: &Identity) -> bool {
        self.name == identity.name
            && self.version.as_ref().is_none_or(|v| *v == identity.version)
            && self
                .workspace
                .as_ref()
                .is_none_or(|w| *w == identity.workspace)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(w) = &self.workspace {
            write!(f, "{w}/")?;
        }
        f.write_str(&self.name)?;
        if let Some(v) = &self.version {
            write!(f, "@{v}")?;
        }
        Ok(())
    }
}

/// The order listings use: dot-separated segments compared numerically when both are whole
/// numbers, byte-wise otherwise; exact ties broken byte-wise. Deterministic for any text.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let mut xs = a.split('.');
    let mut ys = b.split('.');
    loop {
        match (xs.next(), ys.next()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let ord = match (x.parse::<u64>(), y.parse::<u64>()) {
                    (Ok(p), Ok(q)) => p.cmp(&q).then_with(|| x.cmp(y)),
                    _ => x.cmp(y),
                };
                if ord != Ordering::Equal {
                    return ord;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_splits_into_its_parts() {
        let r = Reference::parse("ws/word-count@1.0.0").unwrap();
        assert_eq!(r.workspace.as_deref(), Some("ws"));
        assert_eq!(r.name, "word-count");
        assert_eq!(r.version.as_deref(), Some("1.0.0"));
        let r = Reference::parse("word-count").unwrap();
        assert_eq!((r.workspace, r.version), (None, None));
    }

    #[test]
    fn parts_with_separators_or_whitespace_are_refused() {
        for bad in ["a@b@c", "a b", "", "x/y/z@1", ".hidden", "n@"] {
            assert!(Reference::parse(bad).is_err(), "{bad:?}");
        }
        assert!(check_part("1/2").is_err());
        assert!(check_part("a@b").is_err());
        assert!(check_part("1.10").is_ok());
    }

    #[test]
    fn versions_order_numerically_by_segment() {
        let mut v = vec!["1.10", "1.9", "1.1", "2.0.0", "1.0.0-beta", "1.0.0"];
        v.sort_by(|a, b| compare_versions(a, b));
        assert_eq!(v, ["1.0.0", "1.0.0-beta", "1.1", "1.9", "1.10", "2.0.0"]);
    }
}
