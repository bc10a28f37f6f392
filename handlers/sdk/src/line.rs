//! One line of output built on the stack and written with `uprobe_printf`: usable in signal
//! context, where `format!`/`println!` (which allocate and lock) are not.

use core::ffi::CStr;
use core::fmt;

/// A line of output in a fixed stack buffer.
///
/// Text that does not fit is cut at a character boundary and [`fmt::Write`] reports an error;
/// what fits is still written by [`Line::emit`], which ends the line with `\n`.
///
/// ```
/// use core::fmt::Write;
/// let mut line = uprobe_sdk::Line::new();
/// let _ = write!(line, "hit at {:#x}", 0x401000);
/// assert_eq!(line.as_str(), "hit at 0x401000");
/// ```
pub struct Line {
    buf: [u8; Line::BUF],
    len: usize,
    truncated: bool,
}

impl Line {
    const BUF: usize = 512;
    /// Room for text: the buffer less the `\n` and NUL that [`Line::emit`] adds.
    pub const CAPACITY: usize = Self::BUF - 2;

    pub const fn new() -> Self {
        Self { buf: [0; Self::BUF], len: 0, truncated: false }
    }

    /// The text so far, without the line end.
    pub fn as_str(&self) -> &str {
        // Only whole `str` pieces cut at char boundaries are ever copied in.
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }

    /// Whether some text did not fit.
    pub const fn is_truncated(&self) -> bool {
        self.truncated
    }

    /// Empties the line for reuse.
    pub fn clear(&mut self) {
        self.len = 0;
        self.truncated = false;
    }

    /// Writes the line and a `\n` to the run's output through `uprobe_printf`.
    /// Signal context: yes.
    pub fn emit(&mut self) {
        let end = self.len;
        self.buf[end] = b'\n';
        self.buf[end + 1] = 0;
        if let Ok(line) = CStr::from_bytes_with_nul(&self.buf[..end + 2]) {
            crate::sys::print(line);
        }
    }
}

impl Default for Line {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut result = Ok(());
        for piece in s.split('\0') {
            // A NUL would end the C string early: drop it.
            let room = Self::CAPACITY - self.len;
            let mut take = piece.len().min(room);
            while !piece.is_char_boundary(take) {
                take -= 1;
            }
            self.buf[self.len..self.len + take].copy_from_slice(&piece.as_bytes()[..take]);
            self.len += take;
            if take < piece.len() {
                self.truncated = true;
                result = Err(fmt::Error);
                break;
            }
        }
        result
    }
}

impl fmt::Debug for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Line").field("text", &self.as_str()).field("truncated", &self.truncated).finish()
    }
}

/// Formats one line with [`Line`] and writes it: `uprobe_println!("{} hits", n)`.
/// Signal context: yes. Text past [`Line::CAPACITY`] bytes is cut.
#[macro_export]
macro_rules! uprobe_println {
    ($($arg:tt)*) => {{
        let mut line = $crate::Line::new();
        let _ = ::core::fmt::Write::write_fmt(&mut line, ::core::format_args!($($arg)*));
        line.emit();
    }};
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::fake::take_printed;
    use core::fmt::Write;

    #[test]
    fn formats_without_allocating_and_emits_one_line() {
        let mut line = Line::new();
        write!(line, "count: {:<8} 0x{:016x} {:>5}", "main", 0x55d0_c0a0_1139u64, 1).unwrap();
        assert_eq!(line.as_str(), "count: main     0x000055d0c0a01139     1");
        line.emit();
        assert_eq!(take_printed(), ["count: main     0x000055d0c0a01139     1\n"]);
    }

    #[test]
    fn long_text_is_cut_at_a_char_boundary() {
        let mut line = Line::new();
        let text = "é".repeat(Line::CAPACITY); // two bytes each
        assert!(line.write_str(&text).is_err());
        assert!(line.is_truncated());
        assert_eq!(line.as_str().len(), Line::CAPACITY);
        assert!(write!(line, "x").is_err());
        line.emit();
        let printed = take_printed();
        assert_eq!(printed[0].len(), Line::CAPACITY + 1);
        assert!(printed[0].ends_with("é\n"));
    }

    #[test]
    fn odd_capacity_cut_does_not_split_a_char() {
        let mut line = Line::new();
        line.write_str("a").unwrap();
        let _ = line.write_str(&"é".repeat(Line::CAPACITY));
        // 1 + 2k <= CAPACITY (even): the last two-byte char that fits leaves one byte free.
        assert_eq!(line.as_str().len(), Line::CAPACITY - 1);
    }

    #[test]
    fn nul_bytes_are_dropped() {
        let mut line = Line::new();
        write!(line, "a\0b").unwrap();
        assert_eq!(line.as_str(), "ab");
    }

    #[test]
    fn clear_allows_reuse() {
        let mut line = Line::new();
        let _ = line.write_str(&"x".repeat(Line::BUF));
        line.clear();
        write!(line, "ok").unwrap();
        assert_eq!(line.as_str(), "ok");
        assert!(!line.is_truncated());
    }

    #[test]
    fn macro_emits_a_line() {
        crate::uprobe_println!("{}-{}", 1, 2);
        assert_eq!(take_printed(), ["1-2\n"]);
    }
}
