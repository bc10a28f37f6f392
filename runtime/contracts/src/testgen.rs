//! A seeded generator for the decoders' property tests: the same cases on every run, many of
//! them, no dependency. A failure names its seed.

/// SplitMix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Up to `max` characters from `alphabet`.
    pub fn text(&mut self, alphabet: &[char], max: usize) -> String {
        let len = self.below(max + 1);
        (0..len).map(|_| *self.pick(alphabet)).collect()
    }

    /// A number of any size, small ones more often.
    pub fn number(&mut self) -> u64 {
        match self.below(4) {
            0 => self.below(10) as u64,
            1 => self.below(100_000) as u64,
            2 => u64::MAX - self.below(3) as u64,
            _ => self.next(),
        }
    }

    /// `text` with one character replaced by a different ASCII one.
    pub fn changed(&mut self, text: &str) -> String {
        let chars: Vec<char> = text.chars().collect();
        let at = self.below(chars.len());
        let mut by = chars[at];
        while by == chars[at] {
            by = char::from(self.below(128) as u8);
        }
        chars.iter().enumerate().map(|(i, &c)| if i == at { by } else { c }).collect()
    }
}

/// Characters values are made of: the separators of both encodings among them.
pub const VALUE_CHARS: &[char] =
    &['a', 'b', 'Z', '0', '9', '/', '.', ' ', '=', ',', ':', '-', '+', '%', '\t', 'é', '→', '"'];

/// Every character boundary of `text`, but for its end: the cut points of a truncation.
pub fn cuts(text: &str) -> impl Iterator<Item = &str> {
    text.char_indices().map(|(i, _)| &text[..i])
}
