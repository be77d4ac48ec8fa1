//! The two-sample tests the parity tests compare draws with (tests/augment.rs,
//! tests/transforms.rs): Kolmogorov-Smirnov for continuous and integer quantities, and a
//! proportion within 4 standard errors, both at fixed seeds (deterministic: they cannot flake).

/// The two-sample Kolmogorov-Smirnov statistic of `a` and `b` (ties counted at their value).
pub fn ks(mut a: Vec<f64>, mut b: Vec<f64>) -> f64 {
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (n, m) = (a.len() as f64, b.len() as f64);
    let (mut i, mut j, mut d) = (0, 0, 0.0f64);
    while i < a.len() && j < b.len() {
        let x = a[i].min(b[j]);
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        d = d.max((i as f64 / n - j as f64 / m).abs());
    }
    d
}

/// The KS test's critical value at significance 0.001 for samples of `n` and `m`:
/// c(α) = √(-ln(α/2) / 2) = 1.949.
pub fn ks_critical(n: usize, m: usize) -> f64 {
    let (n, m) = (n as f64, m as f64);
    (-(0.001f64 / 2.0).ln() / 2.0).sqrt() * ((n + m) / (n * m)).sqrt()
}

/// `ours` and `theirs` pass the two-sample KS test at significance 0.001.
pub fn same_distribution(what: &str, ours: Vec<f64>, theirs: Vec<f64>) {
    assert!(!ours.is_empty() && !theirs.is_empty(), "{what}: no draws");
    let (d, crit) = (
        ks(ours.clone(), theirs.clone()),
        ks_critical(ours.len(), theirs.len()),
    );
    assert!(
        d < crit,
        "{what}: KS distance {d:.4} to torchvision's draws, over the 0.001 critical value {crit:.4}"
    );
}

/// Two rates of `n` draws each differ by less than 4 standard errors of their difference
/// (4 × √(2 × 0.25 / n)).
pub fn same_rate(what: &str, ours: f64, theirs: f64, n: usize) {
    let tol = 4.0 * (2.0 * 0.25 / n as f64).sqrt();
    assert!(
        (ours - theirs).abs() < tol,
        "{what}: rate {ours} against torchvision's {theirs} (tolerance {tol:.4})"
    );
}
