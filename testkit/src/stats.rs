//! What the benches share: a least-squares fit, a process's holdings read from `/proc`, the
//! load average, and whole-number settings from the environment.

/// What a process holds now (bytes for memory).
#[derive(Clone, Copy, Debug, Default)]
pub struct Held {
    /// Resident set (`VmRSS`).
    pub rss: f64,
    /// Its anonymous part (`RssAnon`): the heap and stacks, not mapped files.
    pub anon: f64,
    /// Open descriptors.
    pub fds: f64,
    pub threads: f64,
}

/// Reads what process `pid` holds (this process with `None`); a field `/proc` lacks is NaN.
pub fn held(pid: Option<u32>) -> Held {
    let dir = pid.map_or_else(|| "/proc/self".to_owned(), |p| format!("/proc/{p}"));
    let status = std::fs::read_to_string(format!("{dir}/status")).unwrap_or_default();
    let kib = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    Held {
        rss: kib("VmRSS:") * 1024.0,
        anon: kib("RssAnon:") * 1024.0,
        fds: std::fs::read_dir(format!("{dir}/fd")).map_or(f64::NAN, |d| d.count() as f64),
        threads: kib("Threads:"),
    }
}

/// The 1, 5 and 15 minute load averages, for a bench to print beside its figures.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// A whole number from the environment variable `name`, or `default` when it is unset.
/// Panics, naming the variable, on anything else (a bench's own setting).
pub fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, not {v:?}")),
        Err(_) => default,
    }
}

/// The least-squares line through `points` (x, y): its slope and R². A slope of 0 and R² of 0
/// when every x is the same (nothing to fit).
pub fn least_squares(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    if sxx == 0.0 {
        return (0.0, 0.0);
    }
    let slope = sxy / sxx;
    let r2 = if syy == 0.0 {
        1.0
    } else {
        sxy * sxy / (sxx * syy)
    };
    (slope, r2)
}

#[cfg(test)]
mod tests {
    use super::least_squares;

    #[test]
    fn a_line_fits_with_its_own_slope_and_no_residue() {
        let pts: Vec<(f64, f64)> = (0..10).map(|x| (x as f64, 3.0 * x as f64 + 7.0)).collect();
        let (slope, r2) = least_squares(&pts);
        assert!((slope - 3.0).abs() < 1e-9 && (r2 - 1.0).abs() < 1e-9);
    }

    #[test]
    fn this_process_holds_memory_descriptors_and_threads() {
        let h = super::held(None);
        assert!(
            h.rss > 0.0 && h.anon > 0.0 && h.fds > 0.0 && h.threads >= 1.0,
            "{h:?}"
        );
    }

    #[test]
    fn points_at_one_x_have_no_slope() {
        assert_eq!(least_squares(&[(1.0, 2.0), (1.0, 5.0)]), (0.0, 0.0));
    }
}
