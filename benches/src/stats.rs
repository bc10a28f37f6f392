//! Medians over runs and the choice of how many hits one run makes.

/// Median, minimum and maximum of a set of runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// None for an empty set.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Summary { median, min: v[0], max: v[n - 1] })
    }

    /// Every statistic minus `x`.
    pub fn minus(self, x: f64) -> Summary {
        Summary { median: self.median - x, min: self.min - x, max: self.max - x }
    }
}

/// Hits per run so that a run whose hits cost `ns_per_hit` lasts about `target_ns`, rounded
/// to two significant digits and kept within `[min, max]`.
pub fn hits_for(target_ns: f64, ns_per_hit: f64, min: u64, max: u64) -> u64 {
    let raw = if ns_per_hit > 0.0 { target_ns / ns_per_hit } else { max as f64 };
    let raw = raw.clamp(min as f64, max as f64);
    let scale = 10f64.powi(raw.log10().floor() as i32 - 1).max(1.0);
    (((raw / scale).round() * scale) as u64).clamp(min, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_sets() {
        let s = Summary::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 5.0));
        assert_eq!(Summary::of(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(Summary::of(&[f64::NAN]), None);
    }

    #[test]
    fn minus_shifts_everything() {
        let s = Summary::of(&[2.0, 4.0, 6.0]).unwrap().minus(1.0);
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 5.0));
    }

    #[test]
    fn hits_are_sized_to_the_target_and_rounded() {
        assert_eq!(hits_for(1e9, 1000.0, 100, 1_000_000_000), 1_000_000);
        assert_eq!(hits_for(3e8, 1234.0, 100, 1_000_000_000), 240_000);
        assert_eq!(hits_for(1e9, 1e9, 1000, 1_000_000), 1000);
        assert_eq!(hits_for(1e9, 0.0, 1000, 5_000_000), 5_000_000);
    }
}
