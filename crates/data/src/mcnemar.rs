//! McNemar's exact test of two classifiers scored on the same images, as statsmodels'
//! `mcnemar(table, exact=True)` computes it: of the discordant images (one model right, the
//! other wrong), `b` only the first got right and `c` only the second; the statistic is
//! `min(b, c)` and the p-value `min(1, 2 · P(X ≤ min(b, c)))` for `X ~ Binomial(b + c, 1/2)`.
//!
//! The binomial terms are computed as R's `dbinom` and SciPy's do (Catherine Loader's
//! saddle-point expansion: Stirling's error term and the deviance `bd0`), so a term keeps its
//! precision at millions of images where `C(n, k) / 2^n` would overflow, underflow or cancel;
//! the tail is summed down from its largest term.
use serde::{Deserialize, Serialize};

/// The 2×2 table of two models' top-1 correctness, its statistic and p-value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McNemar {
    /// Images both models classify correctly.
    pub both_correct: u64,
    /// Images only the first model (a) classifies correctly: the table's `[0][1]`.
    pub only_a_correct: u64,
    /// Images only the second model (b) classifies correctly: the table's `[1][0]`.
    pub only_b_correct: u64,
    /// Images both models get wrong.
    pub both_wrong: u64,
    /// `min(only_a_correct, only_b_correct)` (statsmodels' `statistic` with `exact=True`).
    pub statistic: u64,
    /// Two-sided exact binomial p-value (statsmodels' `pvalue` with `exact=True`).
    pub p_value: f64,
}

impl McNemar {
    /// The test of `a` against `b`: for each image, whether each model's top-1 is right.
    pub fn of(a_correct: &[bool], b_correct: &[bool]) -> McNemar {
        let mut t = [[0u64; 2]; 2];
        for (&a, &b) in a_correct.iter().zip(b_correct) {
            t[usize::from(!a)][usize::from(!b)] += 1;
        }
        McNemar::from_table(t)
    }

    /// The test of a 2×2 table `[[both right, only a right], [only b right, both wrong]]`.
    pub fn from_table(t: [[u64; 2]; 2]) -> McNemar {
        let (b, c) = (t[0][1], t[1][0]);
        McNemar {
            both_correct: t[0][0],
            only_a_correct: b,
            only_b_correct: c,
            both_wrong: t[1][1],
            statistic: b.min(c),
            p_value: exact_p_value(b, c),
        }
    }

    /// Images on which exactly one of the two models is right.
    pub fn discordant(&self) -> u64 {
        self.only_a_correct + self.only_b_correct
    }
}

/// `min(1, 2 · P(X ≤ min(b, c)))`, `X ~ Binomial(b + c, 1/2)`; 1 when there is no discordant
/// image.
pub fn exact_p_value(b: u64, c: u64) -> f64 {
    (2.0 * binomial_half_cdf(b.min(c), b + c)).min(1.0)
}

/// `P(X ≤ k)` for `X ~ Binomial(n, 1/2)`, `k ≤ n`.
pub fn binomial_half_cdf(k: u64, n: u64) -> f64 {
    if k >= n {
        return 1.0;
    }
    // Below the mode the terms fall as i falls (term(i-1) = term(i) · i / (n - i + 1)); above
    // it, use the symmetry P(X ≤ k) = 1 - P(X ≤ n - k - 1).
    if 2 * k > n {
        return 1.0 - binomial_half_cdf(n - k - 1, n);
    }
    let top = binomial_half_pmf(k, n);
    if top == 0.0 {
        return 0.0;
    }
    let (mut sum, mut term, mut i) = (1.0f64, 1.0f64, k);
    while i > 0 {
        term *= i as f64 / (n - i + 1) as f64;
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
        i -= 1;
    }
    top * sum
}

/// `P(X = x)` for `X ~ Binomial(n, 1/2)` (R's `dbinom_raw` with p = q = 1/2).
pub fn binomial_half_pmf(x: u64, n: u64) -> f64 {
    if x > n {
        return 0.0;
    }
    if x == 0 || x == n {
        return (-(n as f64) * std::f64::consts::LN_2).exp();
    }
    let (nf, xf) = (n as f64, x as f64);
    let half = 0.5 * nf;
    let lc = stirlerr(n) - stirlerr(x) - stirlerr(n - x) - bd0(xf, half) - bd0(nf - xf, half);
    let lf = (2.0 * std::f64::consts::PI).ln() + xf.ln() + (-xf / nf).ln_1p();
    (lc - 0.5 * lf).exp()
}

/// Stirling's error `ln(n!) - ((n + 1/2) ln n - n + ln √(2π))` of R's `stirlerr`, n ≥ 1.
fn stirlerr(n: u64) -> f64 {
    // R's sferr_halves at the integers 1..=15.
    const SMALL: [f64; 15] = [
        0.08106146679532726,
        0.0413406959554093,
        0.02767792568499834,
        0.020790672103765093,
        0.016644691189821193,
        0.013876128823070748,
        0.01189670994589177,
        0.010411265261972096,
        0.009255462182712733,
        0.00833056343336287,
        0.007573675487951841,
        0.00694284010720953,
        0.006408994188004207,
        0.0059513701127588475,
        0.005554733551962801,
    ];
    const S0: f64 = 1.0 / 12.0;
    const S1: f64 = 1.0 / 360.0;
    const S2: f64 = 1.0 / 1260.0;
    const S3: f64 = 1.0 / 1680.0;
    const S4: f64 = 1.0 / 1188.0;
    if n == 0 {
        return 0.0;
    }
    if n <= 15 {
        return SMALL[(n - 1) as usize];
    }
    let nf = n as f64;
    let nn = nf * nf;
    if n > 500 {
        (S0 - S1 / nn) / nf
    } else if n > 80 {
        (S0 - (S1 - S2 / nn) / nn) / nf
    } else if n > 35 {
        (S0 - (S1 - (S2 - S3 / nn) / nn) / nn) / nf
    } else {
        (S0 - (S1 - (S2 - (S3 - S4 / nn) / nn) / nn) / nn) / nf
    }
}

/// The deviance term `x ln(x / np) + np - x` of R's `bd0`, by its series when x is near np
/// (where the closed form cancels).
fn bd0(x: f64, np: f64) -> f64 {
    if (x - np).abs() < 0.1 * (x + np) {
        let mut v = (x - np) / (x + np);
        let mut s = (x - np) * v;
        if s.abs() < f64::MIN_POSITIVE {
            return s;
        }
        let mut ej = 2.0 * x * v;
        v *= v;
        for j in 1..1000 {
            ej *= v;
            let s1 = s + ej / f64::from(2 * j + 1);
            if s1 == s {
                return s1;
            }
            s = s1;
        }
        return s;
    }
    x * (x / np).ln() + np - x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(ours: f64, theirs: f64, rel: f64) -> bool {
        ours == theirs || (ours - theirs).abs() <= rel * theirs.abs()
    }

    /// (b, c, p) with p = min(1, 2 · scipy.stats.binom.cdf(min(b, c), b + c, 0.5)) as
    /// statsmodels 0.15.0 computes it on SciPy 1.17.1.
    const SCIPY: [(u64, u64, f64); 13] = [
        (0, 0, 1.0),
        (0, 1, 1.0),
        (1, 0, 1.0),
        (2, 7, 0.1796875),
        (3, 3, 1.0),
        (0, 25, 5.960464477539063e-08),
        (40, 60, 0.05688793364098089),
        (4800, 5000, 0.04440414879984631),
        (123456, 125000, 0.001964264898704173),
        (1000000, 1002500, 0.0774031263150531),
        (10000000, 10020000, 7.83372881449977e-06),
        (0, 1100, 0.0),
        (500, 2000, 2.855087369006384e-211),
    ];

    #[test]
    fn p_values_equal_scipy_from_one_image_to_ten_million() {
        for (b, c, p) in SCIPY {
            let ours = exact_p_value(b, c);
            assert!(
                close(ours, p, 1e-11),
                "b={b} c={c}: ours {ours:e}, SciPy {p:e}"
            );
            assert_eq!(exact_p_value(c, b), ours, "symmetric in b and c");
        }
    }

    #[test]
    fn small_counts_equal_the_exact_sum_of_binomial_coefficients() {
        // 2^-n · Σ_{i ≤ k} C(n, i) in exact integers, n ≤ 60.
        for n in 0u64..=60 {
            let mut binom = vec![1u128; 1];
            for _ in 0..n {
                let mut next = vec![1u128; binom.len() + 1];
                for i in 1..binom.len() {
                    next[i] = binom[i - 1] + binom[i];
                }
                binom = next;
            }
            let mut cum = 0u128;
            for k in 0..=n {
                cum += binom[k as usize];
                let exact = cum as f64 / 2f64.powi(n as i32);
                let ours = binomial_half_cdf(k, n);
                assert!(close(ours, exact, 1e-13), "n={n} k={k}: {ours} vs {exact}");
                let pmf = binom[k as usize] as f64 / 2f64.powi(n as i32);
                assert!(
                    close(binomial_half_pmf(k, n), pmf, 1e-13),
                    "pmf n={n} k={k}"
                );
            }
        }
    }

    #[test]
    fn stirling_table_matches_its_definition() {
        // ln(n!) - (n + 1/2) ln n + n - ln √(2π), with n! exact in f64 for n ≤ 15.
        let mut fact = 1.0f64;
        for n in 1u64..=15 {
            fact *= n as f64;
            let nf = n as f64;
            let direct =
                fact.ln() - (nf + 0.5) * nf.ln() + nf - 0.5 * (2.0 * std::f64::consts::PI).ln();
            assert!((stirlerr(n) - direct).abs() < 1e-13, "n={n}");
        }
        // The series joins the table at 16 (checked against the same definition).
        let fact16 = fact * 16.0;
        let direct =
            fact16.ln() - 16.5 * 16f64.ln() + 16.0 - 0.5 * (2.0 * std::f64::consts::PI).ln();
        assert!((stirlerr(16) - direct).abs() < 1e-13);
    }

    #[test]
    fn the_table_is_counted_as_statsmodels_reads_it() {
        let a = [true, true, false, false, true, false, true];
        let b = [true, false, true, false, false, true, true];
        let m = McNemar::of(&a, &b);
        assert_eq!(
            (
                m.both_correct,
                m.only_a_correct,
                m.only_b_correct,
                m.both_wrong
            ),
            (2, 2, 2, 1)
        );
        assert_eq!((m.statistic, m.discordant(), m.p_value), (2, 4, 1.0));
    }
}
