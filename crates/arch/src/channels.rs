//! torchvision's `_make_divisible`: channel counts rounded to a multiple of a divisor, as
//! EfficientNet, MobileNetV3 and RegNet size their layers.

/// torchvision's `_make_divisible(v, 8)`: to the nearest multiple of 8 (at least 8), one more
/// step up when that lost more than 10 %.
pub(crate) fn make_divisible(v: f64) -> usize {
    make_divisible_by(v, 8)
}

/// torchvision's `_make_divisible(v, divisor)`: `max(divisor, int(v + divisor / 2) // divisor *
/// divisor)`, one more `divisor` when that lost more than 10 %.
pub(crate) fn make_divisible_by(v: f64, divisor: usize) -> usize {
    let n = (((v + divisor as f64 / 2.0) as usize) / divisor * divisor).max(divisor);
    if (n as f64) < 0.9 * v {
        n + divisor
    } else {
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `_make_divisible(v, 8)` as torchvision's: the nearest multiple of 8, at least 8, one
    /// step up when rounding lost more than 10 %.
    #[test]
    fn make_divisible_is_torchvisions() {
        assert_eq!(make_divisible(35.2), 32); // B2's stem: 32 * 1.1
        assert_eq!(make_divisible(17.6), 16);
        assert_eq!(make_divisible(20.0), 24);
        assert_eq!(make_divisible(11.0), 16); // 8 would lose 27 %
        assert_eq!(make_divisible(3.0), 8);
        assert_eq!(make_divisible(640.0), 640);
        // RegNet's `_make_divisible(w, group_width)`.
        assert_eq!(make_divisible_by(440.0, 8), 440);
        assert_eq!(make_divisible_by(100.0, 24), 96);
        assert_eq!(make_divisible_by(10.0, 16), 16);
    }
}
