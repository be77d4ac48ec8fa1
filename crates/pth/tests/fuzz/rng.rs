//! A small seeded generator (SplitMix64): every case is a pure function of (seed, stage,
//! case index), so a failure is replayed from the numbers it prints.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64, stage: u64, case: u64) -> Rng {
        let mut r = Rng(seed ^ stage.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        r.0 ^= r.next().wrapping_add(case);
        r
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// True one time in `n`.
    pub fn chance(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}
