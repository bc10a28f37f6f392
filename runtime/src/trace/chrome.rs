//! Chrome trace events (`--format chrome`): one event as the Trace Event Format writes it.
//! Pure.

use core::fmt::Write;

use crate::trace::format::json_string;

/// A Chrome trace event: `ph` "X" (a slice, with `dur_ns`), "i" (an instant) or "M".
#[allow(clippy::too_many_arguments)]
pub fn chrome_event(
    out: &mut String,
    ph: char,
    name: &str,
    cat: &str,
    ns: u64,
    dur_ns: Option<u64>,
    pid: i32,
    tid: i32,
    args: &str,
) {
    out.push_str("{\"name\":");
    json_string(out, name.as_bytes());
    out.push_str(",\"cat\":");
    json_string(out, cat.as_bytes());
    let _ = write!(out, ",\"ph\":\"{ph}\",\"ts\":{}.{:03}", ns / 1000, ns % 1000);
    if let Some(d) = dur_ns {
        let _ = write!(out, ",\"dur\":{}.{:03}", d / 1000, d % 1000);
    }
    if ph == 'i' {
        out.push_str(",\"s\":\"t\"");
    }
    let _ = write!(out, ",\"pid\":{pid},\"tid\":{tid},\"args\":{args}}}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chrome_slices_carry_microseconds() {
        let mut s = String::new();
        chrome_event(&mut s, 'X', "add", "uprobes", 1_234_567, Some(2_500), 1, 2, "{}");
        assert_eq!(s, "{\"name\":\"add\",\"cat\":\"uprobes\",\"ph\":\"X\",\"ts\":1234.567,\"dur\":2.500,\"pid\":1,\"tid\":2,\"args\":{}}");
    }
}
