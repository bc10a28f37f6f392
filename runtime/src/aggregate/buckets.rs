//! Histogram buckets laid out as bpftrace lays out `hist()` and `lhist()`, and printed as it
//! prints them. Pure.
//!
//! - log2: `(..., 0)` for negative values, `[0]`, `[1]`, then `[2^k, 2^(k+1))` up to 2^64,
//!   labelled with K, M, G... for powers of 1024 (`[4K, 8K)`);
//! - linear from MIN to MAX by STEP: `(..., MIN)`, `[MIN, MIN+STEP)`, ..., `[MAX, ...)`.
//!
//! A printed histogram runs from its first non-empty bucket to its last, one line a bucket:
//! the range left-aligned in 16 columns, the count right-aligned in 8, and a bar of `@` up to
//! 52 wide, scaled to the largest count.

use core::fmt::Write;

/// Buckets of a log2 histogram: negative, 0, 1, and one per power of two from 2 to 2^63.
pub const LOG2_BUCKETS: usize = 66;
/// The most buckets a linear histogram may have between MIN and MAX.
pub const MAX_LINEAR_BUCKETS: i64 = 1000;
const BAR: usize = 52;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Log2,
    Linear { min: i64, max: i64, step: i64 },
}

/// The log2 bucket of a value that cannot be negative (hit path).
#[inline(always)]
pub fn log2_index(v: u64) -> usize {
    if v == 0 {
        1
    } else {
        2 + (63 - v.leading_zeros() as usize)
    }
}

impl Scale {
    /// How many buckets the histogram keeps.
    pub fn buckets(&self) -> usize {
        match *self {
            Scale::Log2 => LOG2_BUCKETS,
            Scale::Linear { min, max, step } => ((max - min) / step) as usize + 2,
        }
    }

    /// The bucket of `v` (hit path).
    #[inline(always)]
    pub fn index(&self, v: i128) -> usize {
        match *self {
            Scale::Log2 if v < 0 => 0,
            Scale::Log2 => log2_index(v as u64),
            Scale::Linear { min, max, step } => {
                if v < i128::from(min) {
                    0
                } else if v >= i128::from(max) {
                    ((max - min) / step) as usize + 1
                } else {
                    ((v - i128::from(min)) / i128::from(step)) as usize + 1
                }
            }
        }
    }

    /// Bucket `i` as `[low, high)`; None for an end that is open.
    pub fn bounds(&self, i: usize) -> (Option<i128>, Option<i128>) {
        match *self {
            Scale::Log2 => match i {
                0 => (None, Some(0)),
                1 => (Some(0), Some(1)),
                i => (Some(1i128 << (i - 2)), Some(1i128 << (i - 1))),
            },
            Scale::Linear { min, max, step } => {
                let last = ((max - min) / step) as usize + 1;
                match i {
                    0 => (None, Some(i128::from(min))),
                    i if i == last => (Some(i128::from(max)), None),
                    i => {
                        let low = i128::from(min) + (i as i128 - 1) * i128::from(step);
                        (Some(low), Some(low + i128::from(step)))
                    }
                }
            }
        }
    }

    /// Bucket `i`'s range as bpftrace writes it.
    pub fn label(&self, i: usize) -> String {
        match *self {
            Scale::Log2 => match i {
                0 => "(..., 0)".into(),
                1 => "[0]".into(),
                2 => "[1]".into(),
                i => format!("[{}, {})", power_label(i as u32 - 2), power_label(i as u32 - 1)),
            },
            Scale::Linear { step, .. } => {
                let number = |n: i128| linear_label(n, step);
                match self.bounds(i) {
                    (None, Some(high)) => format!("(..., {})", number(high)),
                    (Some(low), None) => format!("[{}, ...)", number(low)),
                    (Some(low), Some(high)) => format!("[{}, {})", number(low), number(high)),
                    (None, None) => String::new(),
                }
            }
        }
    }
}

/// 2^`power` with a suffix for its largest power of 1024: 512, 1K, 2M, 16E.
fn power_label(power: u32) -> String {
    let decade = (power / 10).min(6);
    let suffix = ["", "K", "M", "G", "T", "P", "E"][decade as usize];
    format!("{}{suffix}", 1u64 << (power - 10 * decade))
}

/// A linear bound, with K or M where the step is a multiple of 1024 and the bound of 1024
/// or 1048576.
fn linear_label(n: i128, step: i64) -> String {
    const K: i128 = 1024;
    if step % 1024 != 0 || n == 0 {
        return n.to_string();
    }
    if n % (K * K) == 0 {
        format!("{}M", n / (K * K))
    } else if n % K == 0 {
        format!("{}K", n / K)
    } else {
        n.to_string()
    }
}

/// The histogram `counts` (one per bucket of `scale`) as bpftrace prints it; nothing when
/// every bucket is empty.
pub fn write(out: &mut String, scale: &Scale, counts: &[u64]) {
    let Some(first) = counts.iter().position(|&c| c > 0) else { return };
    let last = counts.iter().rposition(|&c| c > 0).unwrap_or(first);
    let max = counts.iter().copied().max().unwrap_or(1).max(1);
    for (i, &c) in counts.iter().enumerate().take(last + 1).skip(first) {
        let bar = (u128::from(c) * BAR as u128 / u128::from(max)) as usize;
        let _ = writeln!(out, "{:<16}{c:>8} |{:<BAR$}|", scale.label(i), "@".repeat(bar));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_buckets_hold_their_values() {
        let s = Scale::Log2;
        assert_eq!((s.index(-5), s.index(0), s.index(1), s.index(2), s.index(3), s.index(4)), (0, 1, 2, 3, 3, 4));
        assert_eq!(s.index(1023), 11);
        assert_eq!(s.index(1024), 12);
        assert_eq!(s.index(i128::from(u64::MAX)), 65);
        for v in [0i128, 1, 2, 7, 8, 1000, 1 << 40, i128::from(u64::MAX)] {
            let (low, high) = s.bounds(s.index(v));
            assert!(low.unwrap() <= v && v < high.unwrap(), "{v}");
        }
        assert_eq!(
            (s.label(0), s.label(1), s.label(2), s.label(3)),
            ("(..., 0)".into(), "[0]".into(), "[1]".into(), "[2, 4)".into())
        );
        assert_eq!(s.label(11), "[512, 1K)");
        assert_eq!(s.label(22), "[1M, 2M)");
        assert_eq!(s.label(65), "[8E, 16E)");
    }

    #[test]
    fn linear_buckets_hold_their_values() {
        let s = Scale::Linear { min: 0, max: 500, step: 100 };
        assert_eq!(s.buckets(), 7);
        assert_eq!(
            (s.index(-1), s.index(0), s.index(99), s.index(100), s.index(499), s.index(500)),
            (0, 1, 1, 2, 5, 6)
        );
        assert_eq!((s.label(0), s.label(1), s.label(6)), ("(..., 0)".into(), "[0, 100)".into(), "[500, ...)".into()));
        let k = Scale::Linear { min: 0, max: 4096, step: 1024 };
        assert_eq!(k.label(2), "[1K, 2K)");
        let neg = Scale::Linear { min: -10, max: 10, step: 5 };
        assert_eq!((neg.index(-10), neg.index(-6), neg.index(-5), neg.index(9)), (1, 1, 2, 4));
        assert_eq!(neg.bounds(1), (Some(-10), Some(-5)));
    }

    #[test]
    fn printed_as_bpftrace_prints_hist() {
        let mut counts = vec![0u64; LOG2_BUCKETS];
        counts[1] = 1;
        counts[3] = 4;
        counts[4] = 2;
        let mut out = String::new();
        write(&mut out, &Scale::Log2, &counts);
        assert_eq!(
            out,
            "[0]                    1 |@@@@@@@@@@@@@                                       |\n\
             [1]                    0 |                                                    |\n\
             [2, 4)                 4 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|\n\
             [4, 8)                 2 |@@@@@@@@@@@@@@@@@@@@@@@@@@                          |\n"
        );
        let mut empty = String::new();
        write(&mut empty, &Scale::Log2, &[0; LOG2_BUCKETS]);
        assert_eq!(empty, "");
    }
}
