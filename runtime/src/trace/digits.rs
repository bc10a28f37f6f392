//! Numbers and padding written by hand into a byte buffer, without formatting machinery:
//! the drain thread writes every record's text with them. Pure.

/// A number's digits, written right to left into a small buffer (no formatting machinery:
/// the drain thread formats every record).
#[derive(Default)]
pub struct Digits([u8; 24]);

impl Digits {
    pub fn new() -> Digits {
        Digits::default()
    }

    /// `v` in decimal, with a '-' first when `negative`.
    pub fn of(&mut self, mut v: u64, negative: bool) -> &[u8] {
        let mut at = self.0.len();
        loop {
            at -= 1;
            self.0[at] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        if negative {
            at -= 1;
            self.0[at] = b'-';
        }
        &self.0[at..]
    }

    /// `v` in lowercase hexadecimal, without a prefix.
    pub fn hex(&mut self, mut v: u64) -> &[u8] {
        let mut at = self.0.len();
        loop {
            at -= 1;
            self.0[at] = b"0123456789abcdef"[(v & 15) as usize];
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        &self.0[at..]
    }
}

/// `text` right-aligned in `width` columns (counted in bytes, as the kernel's trace does).
pub fn pad_left(out: &mut Vec<u8>, text: &[u8], width: usize) {
    out.resize(out.len() + width.saturating_sub(text.len()), b' ');
    out.extend_from_slice(text);
}

/// `text` left-aligned in `width` columns.
pub fn pad_right(out: &mut Vec<u8>, text: &[u8], width: usize) {
    out.extend_from_slice(text);
    out.resize(out.len() + width.saturating_sub(text.len()), b' ');
}

/// `v` in decimal with leading zeros to `width` digits.
pub fn zero_pad(out: &mut Vec<u8>, v: u64, width: usize) {
    let mut digits = Digits::new();
    let text = digits.of(v, false);
    out.resize(out.len() + width.saturating_sub(text.len()), b'0');
    out.extend_from_slice(text);
}
