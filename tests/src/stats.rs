//! Small statistics the benches share.

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
    fn points_at_one_x_have_no_slope() {
        assert_eq!(least_squares(&[(1.0, 2.0), (1.0, 5.0)]), (0.0, 0.0));
    }
}
