//! Stacks in records (`$ustack`): read back from a record, and shown as `perf script` shows a
//! call chain (a frame a line, `\t    ADDR NAME`, a blank line after the event's), or as a
//! JSON array of frames. Frames are named here, when the records are written out, never at
//! the hit. Pure, given a [`Namer`].

use core::fmt::Write;

use crate::probe::stacks::CORRUPT;

/// What names an address: `sym+0xoff`, or the address in hex where it has no symbol.
pub type Namer<'a> = &'a mut dyn FnMut(u64) -> String;

/// A stack's frames as a record holds them at `*at` (a u32 count, a u32 pad, the frames),
/// `*at` moved past them; None when the record is cut short.
pub fn decode(rec: &[u8], at: &mut usize) -> Option<Vec<u64>> {
    let n = u32::from_le_bytes(rec.get(*at..*at + 4)?.try_into().ok()?) as usize;
    *at += 8;
    let bytes = rec.get(*at..*at + n.checked_mul(8)?)?;
    *at += 8 * n;
    Some(bytes.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default())).collect())
}

/// A frame's name: `sym+0xoff` (or the address); a caller's frame (`caller`: a return
/// address) is named by the call before it, as gdb names it, shown at the return address.
pub fn frame(addr: u64, caller: bool, syms: Namer) -> String {
    if addr == CORRUPT {
        return "[stack unreadable from here]".into();
    }
    let name = syms(addr - u64::from(caller));
    match name.rsplit_once("+0x").map(|(s, off)| (s, u64::from_str_radix(off, 16))) {
        Some((sym, Ok(off))) if caller => format!("{sym}+{:#x}", off + 1),
        Some(_) => name,
        // No symbol: the address itself.
        None => format!("{addr:#x}"),
    }
}

/// The call chain as `perf script` prints it under its event: `\t    ADDR NAME` a frame.
pub fn text(out: &mut Vec<u8>, frames: &[u64], syms: Namer) {
    for (i, &addr) in frames.iter().enumerate() {
        let name = frame(addr, i > 0, syms);
        let mut line = String::new();
        let _ = writeln!(line, "\t    {addr:x} {name}");
        out.extend_from_slice(line.as_bytes());
    }
}

/// The frames' names, innermost first.
pub fn names(frames: &[u64], syms: Namer) -> Vec<String> {
    frames.iter().enumerate().map(|(i, &addr)| frame(addr, i > 0, syms)).collect()
}

/// A Chrome trace's `stackFrames`: each frame once per caller chain, ids from 1, an event's
/// stack named by its innermost frame's id (`sf`).
#[derive(Default)]
pub struct Frames {
    ids: std::collections::HashMap<(usize, u64, bool), usize>,
    /// Per id - 1: the frame's name and its parent's id (0: none).
    list: Vec<(String, usize)>,
}

impl Frames {
    /// The id of stack `v`'s innermost frame, its frames added as needed; None for no frame.
    pub fn id(&mut self, all: &[u64], syms: Namer) -> Option<usize> {
        let mut parent = 0;
        for (i, &addr) in all.iter().enumerate().rev() {
            let next = self.list.len() + 1;
            let id = *self.ids.entry((parent, addr, i > 0)).or_insert(next);
            if id == next {
                self.list.push((frame(addr, i > 0, syms), parent));
            }
            parent = id;
        }
        (parent != 0).then_some(parent)
    }

    /// `"stackFrames":{...},` when there are frames, names written by `quote`.
    pub fn json(&self, out: &mut String, quote: fn(&mut String, &[u8])) {
        if self.list.is_empty() {
            return;
        }
        out.push_str("\"stackFrames\":{");
        for (i, (name, parent)) in self.list.iter().enumerate() {
            let _ = write!(out, "{}\"{}\":{{\"name\":", if i > 0 { "," } else { "" }, i + 1);
            quote(out, name.as_bytes());
            if *parent != 0 {
                let _ = write!(out, ",\"parent\":\"{parent}\"");
            }
            out.push('}');
        }
        out.push_str("},");
    }
}

/// A Chrome event just written at the end of `text` given its stack: `"sf":ID` added.
pub fn with_sf(text: &mut String, sf: Option<usize>) {
    if let Some(sf) = sf.filter(|_| text.ends_with('}')) {
        text.pop();
        let _ = write!(text, ",\"sf\":\"{sf}\"}}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(addr: u64) -> String {
        match addr {
            0x1000..=0x1fff => format!("leaf+{:#x}", addr - 0x1000),
            0x2000..=0x2fff => format!("main+{:#x}", addr - 0x2000),
            _ => format!("{addr:#x}"),
        }
    }

    fn quote(out: &mut String, b: &[u8]) {
        out.push('"');
        out.push_str(&String::from_utf8_lossy(b));
        out.push('"');
    }

    #[test]
    fn a_chain_reads_back_and_shows_as_perf_script() {
        let mut rec = vec![0u8; 4];
        rec.extend(3u32.to_le_bytes());
        rec.extend(0u32.to_le_bytes());
        for f in [0x1000u64, 0x2010, CORRUPT] {
            rec.extend(f.to_le_bytes());
        }
        let mut at = 4;
        let v = decode(&rec, &mut at).unwrap();
        assert_eq!(at, rec.len());
        let mut t = Vec::new();
        text(&mut t, &v, &mut fake);
        assert_eq!(
            String::from_utf8(t).unwrap(),
            "\t    1000 leaf+0x0\n\t    2010 main+0x10\n\t    1 [stack unreadable from here]\n"
        );
        assert_eq!(names(&v, &mut fake), ["leaf+0x0", "main+0x10", "[stack unreadable from here]"]);
        assert_eq!(frame(0x3010, true, &mut fake), "0x3010");
        let mut f = Frames::default();
        assert_eq!(f.id(&v, &mut fake), Some(3));
        assert_eq!((f.id(&[0x1000, 0x2010], &mut fake), f.id(&[], &mut fake)), (Some(5), None));
        let mut j = String::new();
        f.json(&mut j, quote);
        assert_eq!(
            j,
            r#""stackFrames":{"1":{"name":"[stack unreadable from here]"},"2":{"name":"main+0x10","parent":"1"},"3":{"name":"leaf+0x0","parent":"2"},"4":{"name":"main+0x10"},"5":{"name":"leaf+0x0","parent":"4"}},"#
        );
        let mut short = 4;
        assert_eq!(decode(&rec[..rec.len() - 1], &mut short), None);
    }
}
