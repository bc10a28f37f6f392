//! `uprobe_printf`: printf-style formatting that is async-signal-safe (no allocation, no
//! locks, no locale), for handlers.
//!
//! The formatter is pure and works on any [`Args`] source. The exported `uprobe_printf` is a
//! small assembly entry that spills the System V integer argument registers next to the
//! caller's stack arguments, which is all a variadic call with integer and pointer arguments
//! needs. Floating-point conversions are not supported (their arguments travel in vector
//! registers) and print as `%?`.

use core::ffi::{c_char, c_int, CStr};

use crate::base::output;
use crate::probe::thread;

/// Where the formatter takes its arguments from, in order.
pub trait Args {
    fn next_u64(&mut self) -> u64;
}

/// A fixed-capacity output buffer that silently truncates.
pub struct Buf<const N: usize> {
    bytes: [u8; N],
    len: usize,
    /// How many bytes the full output would take.
    wanted: usize,
}

impl<const N: usize> Buf<N> {
    pub fn new() -> Self {
        Buf { bytes: [0; N], len: 0, wanted: 0 }
    }

    fn push(&mut self, b: u8) {
        self.wanted += 1;
        if self.len < N {
            self.bytes[self.len] = b;
            self.len += 1;
        }
    }

    fn push_all(&mut self, s: &[u8]) {
        s.iter().for_each(|&b| self.push(b));
    }

    fn pad(&mut self, b: u8, n: usize) {
        (0..n).for_each(|_| self.push(b));
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    pub fn wanted(&self) -> usize {
        self.wanted
    }
}

impl<const N: usize> Default for Buf<N> {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Default)]
struct Conv {
    left: bool,
    zero: bool,
    alt: bool,
    plus: bool,
    space: bool,
    width: usize,
    precision: Option<usize>,
    /// 0: int, 1: char (hh), 2: short (h), 8: long/long long/size_t.
    size: u8,
}

fn digits(mut v: u64, base: u64, upper: bool, out: &mut [u8; 24]) -> usize {
    let table = if upper { b"0123456789ABCDEF" } else { b"0123456789abcdef" };
    let mut n = 0;
    loop {
        out[23 - n] = table[(v % base) as usize];
        n += 1;
        v /= base;
        if v == 0 {
            return n;
        }
    }
}

fn put_number<const N: usize>(
    out: &mut Buf<N>,
    c: &Conv,
    negative: bool,
    v: u64,
    base: u64,
    upper: bool,
    prefix: &[u8],
) {
    let mut tmp = [0u8; 24];
    let mut n = digits(v, base, upper, &mut tmp);
    if c.precision == Some(0) && v == 0 {
        n = 0;
    }
    let digits = &tmp[24 - n..];
    let sign: &[u8] = if negative {
        b"-"
    } else if c.plus {
        b"+"
    } else if c.space {
        b" "
    } else {
        b""
    };
    let zeros = c.precision.map_or(0, |p| p.saturating_sub(n));
    let body = sign.len() + prefix.len() + zeros + n;
    let fill = c.width.saturating_sub(body);
    if c.left {
        out.push_all(sign);
        out.push_all(prefix);
        out.pad(b'0', zeros);
        out.push_all(digits);
        out.pad(b' ', fill);
    } else if c.zero && c.precision.is_none() {
        out.push_all(sign);
        out.push_all(prefix);
        out.pad(b'0', fill + zeros);
        out.push_all(digits);
    } else {
        out.pad(b' ', fill);
        out.push_all(sign);
        out.push_all(prefix);
        out.pad(b'0', zeros);
        out.push_all(digits);
    }
}

fn put_text<const N: usize>(out: &mut Buf<N>, c: &Conv, text: &[u8]) {
    let text = &text[..c.precision.map_or(text.len(), |p| p.min(text.len()))];
    let fill = c.width.saturating_sub(text.len());
    if !c.left {
        out.pad(b' ', fill);
    }
    out.push_all(text);
    if c.left {
        out.pad(b' ', fill);
    }
}

/// Formats `fmt` with `args` into `out`.
///
/// # Safety
/// Every `%s` argument must be NULL or point to a NUL-terminated string.
pub unsafe fn format<const N: usize>(out: &mut Buf<N>, fmt: &[u8], args: &mut impl Args) {
    let mut i = 0;
    while i < fmt.len() {
        let b = fmt[i];
        i += 1;
        if b != b'%' {
            out.push(b);
            continue;
        }
        let mut c = Conv::default();
        while let Some(&f) = fmt.get(i) {
            match f {
                b'-' => c.left = true,
                b'0' => c.zero = true,
                b'#' => c.alt = true,
                b'+' => c.plus = true,
                b' ' => c.space = true,
                _ => break,
            }
            i += 1;
        }
        if fmt.get(i) == Some(&b'*') {
            let w = args.next_u64() as i32;
            c.left |= w < 0;
            c.width = w.unsigned_abs() as usize;
            i += 1;
        }
        while let Some(d @ b'0'..=b'9') = fmt.get(i) {
            c.width = c.width * 10 + usize::from(d - b'0');
            i += 1;
        }
        if fmt.get(i) == Some(&b'.') {
            i += 1;
            let mut p = 0;
            if fmt.get(i) == Some(&b'*') {
                p = (args.next_u64() as i32).max(0) as usize;
                i += 1;
            }
            while let Some(d @ b'0'..=b'9') = fmt.get(i) {
                p = p * 10 + usize::from(d - b'0');
                i += 1;
            }
            c.precision = Some(p);
        }
        loop {
            match fmt.get(i) {
                Some(b'h') => c.size = if c.size == 2 { 1 } else { 2 },
                Some(b'l' | b'z' | b'j' | b't' | b'q' | b'L') => c.size = 8,
                _ => break,
            }
            i += 1;
        }
        let Some(&conv) = fmt.get(i) else {
            out.push(b'%');
            break;
        };
        i += 1;
        let unsigned = |v: u64, size: u8| match size {
            1 => v as u8 as u64,
            2 => v as u16 as u64,
            8 => v,
            _ => v as u32 as u64,
        };
        match conv {
            b'd' | b'i' => {
                let raw = args.next_u64();
                let v = match c.size {
                    1 => raw as i8 as i64,
                    2 => raw as i16 as i64,
                    8 => raw as i64,
                    _ => raw as i32 as i64,
                };
                put_number(out, &c, v < 0, v.unsigned_abs(), 10, false, b"");
            }
            b'u' => put_number(out, &c, false, unsigned(args.next_u64(), c.size), 10, false, b""),
            b'x' | b'X' => {
                let v = unsigned(args.next_u64(), c.size);
                let prefix: &[u8] = match (c.alt && v != 0, conv) {
                    (true, b'x') => b"0x",
                    (true, _) => b"0X",
                    _ => b"",
                };
                put_number(out, &c, false, v, 16, conv == b'X', prefix);
            }
            b'o' => {
                let v = unsigned(args.next_u64(), c.size);
                put_number(out, &c, false, v, 8, false, if c.alt && v != 0 { b"0" } else { b"" });
            }
            b'p' => {
                let v = args.next_u64();
                if v == 0 {
                    put_text(out, &Conv { precision: None, ..c }, b"(nil)");
                } else {
                    put_number(out, &c, false, v, 16, false, b"0x");
                }
            }
            b'c' => {
                let ch = [args.next_u64() as u8];
                put_text(out, &Conv { precision: None, ..c }, &ch);
            }
            b's' => {
                let p = args.next_u64() as *const c_char;
                let text: &[u8] = if p.is_null() {
                    b"(null)"
                } else {
                    // SAFETY: the caller guarantees %s arguments are C strings.
                    unsafe { CStr::from_ptr(p) }.to_bytes()
                };
                put_text(out, &c, text);
            }
            b'%' => out.push(b'%'),
            b'f' | b'F' | b'e' | b'E' | b'g' | b'G' | b'a' | b'A' => out.push_all(b"%?"),
            other => {
                out.push(b'%');
                out.push(other);
            }
        }
    }
}

/// The arguments of a variadic call as the entry stub saved them.
struct VaArgs {
    regs: *const u64,
    stack: *const u64,
    next: usize,
}

impl Args for VaArgs {
    fn next_u64(&mut self) -> u64 {
        let i = self.next;
        self.next += 1;
        // SAFETY: the entry stub saved 5 register arguments; later ones are the caller's stack
        // arguments, which exist as far as the format string asks for them (printf's contract).
        unsafe {
            if i < 5 {
                *self.regs.add(i)
            } else {
                *self.stack.add(i - 5)
            }
        }
    }
}

/// The body of `uprobe_printf` (signal-safe); `caller` is its return address.
extern "C" fn printf_body(fmt: *const c_char, regs: *const u64, stack: *const u64, caller: usize) -> c_int {
    if fmt.is_null() {
        return -1;
    }
    let mut out = Buf::<1024>::new();
    let mut args = VaArgs { regs, stack, next: 0 };
    // SAFETY: fmt is a C string (printf's contract), as are its %s arguments.
    unsafe { format(&mut out, CStr::from_ptr(fmt).to_bytes(), &mut args) };
    // The running handler says whose output this is; a call from elsewhere (an entry point
    // of a handler library) is known by its caller.
    let code = thread::current().code.get();
    output::emit_from(if code != 0 { code } else { caller }, out.as_bytes());
    out.wanted() as c_int
}

/// `int uprobe_printf(const char *fmt, ...)`.
///
/// # Safety
/// Called from C with printf's contract: a format string and matching arguments.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn uprobe_printf() -> c_int {
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "sub rsp, 48",
        "mov [rsp], rsi",
        "mov [rsp + 8], rdx",
        "mov [rsp + 16], rcx",
        "mov [rsp + 24], r8",
        "mov [rsp + 32], r9",
        "mov rsi, rsp",
        "lea rdx, [rbp + 16]",
        "mov rcx, [rbp + 8]",
        "call {body}",
        "leave",
        "ret",
        body = sym printf_body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    struct List(Vec<u64>, usize);

    impl Args for List {
        fn next_u64(&mut self) -> u64 {
            self.1 += 1;
            self.0[self.1 - 1]
        }
    }

    fn fmt(f: &str, args: &[u64]) -> String {
        let mut out = Buf::<256>::new();
        // SAFETY: the tests pass %s arguments as pointers to C strings.
        unsafe { format(&mut out, f.as_bytes(), &mut List(args.to_vec(), 0)) };
        String::from_utf8_lossy(out.as_bytes()).into_owned()
    }

    extern "C" {
        fn snprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ...) -> c_int;
    }

    fn libc_fmt1(f: &str, v: u64) -> String {
        let mut buf = [0 as c_char; 256];
        let cf = std::ffi::CString::new(f).unwrap();
        // SAFETY: a large enough buffer, a C format string and one integer argument.
        unsafe { snprintf(buf.as_mut_ptr(), buf.len(), cf.as_ptr(), v) };
        // SAFETY: snprintf NUL-terminates.
        unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn integers_agree_with_libc() {
        let formats = [
            "%d", "%i", "%u", "%ld", "%lu", "%lld", "%llu", "%x", "%lx", "%llx", "%#lx", "%#x", "%X", "%o", "%#o",
            "%5d", "%-5d|", "%05d", "%+d", "% d", "%.3d", "%8.3d", "%-8.3x|", "%016lx", "%#018lx", "%hhd", "%hd",
            "%hu", "%zu", "%p", "%20p", "%.0d", "%c",
        ];
        for f in formats {
            for v in [0u64, 1, 42, 255, 65, 0xdead_beef, u64::MAX, (-7i64) as u64, i64::MIN as u64, 0x8000_0000] {
                if f == "%c" && v as u8 == 0 {
                    continue;
                }
                assert_eq!(fmt(f, &[v]), libc_fmt1(f, v), "format {f} value {v:#x}");
            }
        }
    }

    #[test]
    fn strings_widths_and_percent() {
        let s = c"probe";
        let p = s.as_ptr() as u64;
        assert_eq!(fmt("[%s]", &[p]), "[probe]");
        assert_eq!(fmt("[%8s]", &[p]), "[   probe]");
        assert_eq!(fmt("[%-8s]", &[p]), "[probe   ]");
        assert_eq!(fmt("[%.3s]", &[p]), "[pro]");
        assert_eq!(fmt("[%*s]", &[7, p]), "[  probe]");
        assert_eq!(fmt("%s", &[0]), "(null)");
        assert_eq!(fmt("100%%", &[]), "100%");
        assert_eq!(fmt("Hit #%d on probepoint at %#lx\n", &[3, 0x401126]), "Hit #3 on probepoint at 0x401126\n");
        assert_eq!(fmt("%f", &[]), "%?");
    }

    #[test]
    fn truncates_but_counts() {
        let mut out = Buf::<4>::new();
        // SAFETY: no %s.
        unsafe { format(&mut out, b"abcdef", &mut List(vec![], 0)) };
        assert_eq!((out.as_bytes(), out.wanted()), (&b"abcd"[..], 6));
    }
}
