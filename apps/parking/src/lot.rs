//! The parking lot the cameras watch, synthesised: `spots` spots (SPRIGHT: 164, the
//! CNR-Park+EXT lot), every one taken by a car. Between two snapshot bursts each car leaves
//! with probability `turnover` and a car never seen before takes its spot; the others stay
//! (and are known plates at the next burst). Plates are drawn from `seed`: two capital letters,
//! three digits, two capital letters (`KX482TB`); a share `electric` of them start with `E`
//! (cheaper tariff, see [`crate::record::tariff_for`]), the others never do. The same
//! configuration always gives the same plates, burst by burst.

use std::collections::HashSet;

/// The lot's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct LotConfig {
    /// Spots (one snapshot each per burst).
    pub spots: u32,
    /// Chance that a spot's car is replaced between two bursts.
    pub turnover: f64,
    /// Share of plates starting with `E`.
    pub electric: f64,
    /// Seed of the plates.
    pub seed: u64,
}

impl Default for LotConfig {
    fn default() -> Self {
        Self {
            spots: 164,
            turnover: 0.25,
            electric: 0.1,
            seed: 1,
        }
    }
}

/// The lot at one burst.
#[derive(Clone, Debug)]
pub struct Lot {
    cfg: LotConfig,
    rng: u64,
    cars: Vec<String>,
    issued: HashSet<String>,
}

impl Lot {
    /// The lot at its first burst: every spot taken by a new car.
    pub fn new(cfg: LotConfig) -> Self {
        let mut lot = Self {
            rng: cfg.seed ^ 0x005e_ed0f_1a7e,
            cars: Vec::new(),
            issued: HashSet::new(),
            cfg,
        };
        for _ in 0..lot.cfg.spots {
            let p = lot.new_plate();
            lot.cars.push(p);
        }
        lot
    }

    /// The plate at each spot.
    pub fn cars(&self) -> &[String] {
        &self.cars
    }

    /// Moves to the next burst: cars leave and new ones arrive.
    pub fn advance(&mut self) {
        for i in 0..self.cars.len() {
            if self.unit() < self.cfg.turnover {
                self.cars[i] = self.new_plate();
            }
        }
    }

    fn next_u64(&mut self) -> u64 {
        // SplitMix64.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn letter(&mut self, not_e: bool) -> char {
        loop {
            let c = char::from(b'A' + (self.next_u64() % 26) as u8);
            if !(not_e && c == 'E') {
                return c;
            }
        }
    }

    /// A plate never issued before in this lot.
    fn new_plate(&mut self) -> String {
        loop {
            let electric = self.unit() < self.cfg.electric;
            let first = if electric { 'E' } else { self.letter(true) };
            let p = format!(
                "{first}{}{:03}{}{}",
                self.letter(false),
                self.next_u64() % 1000,
                self.letter(false),
                self.letter(false)
            );
            if self.issued.insert(p.clone()) {
                return p;
            }
        }
    }
}

/// The plates of `bursts` bursts of the lot `cfg`, burst by burst.
pub fn plates_per_burst(cfg: &LotConfig, bursts: usize) -> Vec<Vec<String>> {
    let mut lot = Lot::new(cfg.clone());
    let mut out = Vec::new();
    for b in 0..bursts {
        if b > 0 {
            lot.advance();
        }
        out.push(lot.cars().to_vec());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::valid_plate;

    #[test]
    fn cars_stay_or_are_replaced_by_new_plates() {
        let cfg = LotConfig::default();
        let bursts = plates_per_burst(&cfg, 5);
        assert_eq!(bursts, plates_per_burst(&cfg, 5), "deterministic");
        let mut seen = HashSet::new();
        let mut stayed = 0;
        for (b, cars) in bursts.iter().enumerate() {
            assert_eq!(cars.len(), 164);
            for (spot, p) in cars.iter().enumerate() {
                assert!(valid_plate(p), "{p}");
                if b > 0 && bursts[b - 1][spot] == *p {
                    stayed += 1;
                } else {
                    // A new car: never seen anywhere before.
                    assert!(seen.insert(p.clone()), "{p} came back");
                }
            }
        }
        // About three quarters of the cars stay from one burst to the next.
        let rate = stayed as f64 / (4.0 * 164.0);
        assert!((0.65..0.85).contains(&rate), "{rate}");
        let electric = seen.iter().filter(|p| p.starts_with('E')).count() as f64;
        assert!((0.05..0.2).contains(&(electric / seen.len() as f64)));
    }
}
