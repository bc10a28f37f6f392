//! Stacks counted by `--by ustack` as folded lines (`--format folded`), as Brendan Gregg's
//! `stackcollapse` scripts write them: one `frame;frame;frame count` line per stack,
//! outermost frame first, a frame named by its function alone (`sqlite3VdbeExec`, not
//! `sqlite3VdbeExec+0x131d (libsqlite3.so.0)`), so that the calls of one function from
//! different places of its caller fold into one line; a frame without a symbol stays
//! `FILE+OFFSET`. The other parts of the key (`--by tid,ustack`) come first, as the
//! outermost frames, and the event's name before them when several events are counted by
//! stack. Timed calls split by stack (`--latency WHERE --by ustack`) give one line per
//! stack weighed by its calls' total ns, as off-CPU flame graphs are. The same lines make the
//! flame graph (`--flamegraph`, [`svg`]). Pure but for
//! [`svg`], which writes a file.

use core::fmt::Write;

use crate::aggregate::merge::Snapshot;
use crate::aggregate::plan::Plans;
use crate::aggregate::split;
use crate::aggregate::tables::{self, EventView, Names};

/// The events counted by a key with a stack part.
fn stacked(plans: &Plans) -> Vec<usize> {
    let has_stack = |i: &usize| plans.events[*i].key.iter().flatten().any(|p| p.key.depth().is_some());
    (0..plans.events.len()).filter(has_stack).collect()
}

/// The folded stacks of the report, and the hits left out of them (not counted by key, or
/// left out by `--top`), the largest counts first (equal counts in the order of their
/// lines).
pub fn lines(plans: &Plans, events: &[EventView], snap: &Snapshot, names: &mut dyn Names) -> (Vec<(String, u64)>, u64) {
    let stacked = stacked(plans);
    let mut lines: Vec<(String, u64)> = Vec::new();
    let mut left_out = 0;
    for &event in stacked.iter().filter(|&&e| plans.events[e].latency.is_none()) {
        let k = tables::keyed(plans, snap, events, event, names);
        left_out += k.rest.1 + k.dropped + k.unblocked;
        let parts: Vec<bool> = plans.events[event].key.iter().flatten().map(|p| p.key.depth().is_some()).collect();
        for row in &k.rows {
            let event = (stacked.len() > 1).then(|| events[event].name);
            add_line(&mut lines, event, &row.cells, &parts, row.count);
        }
    }
    // Timed calls by stack: each stack's total ns, as off-CPU flame graphs weigh theirs.
    for (l, plan) in plans.latencies.iter().enumerate().filter(|(_, p)| stacked.contains(&p.event)) {
        let k = split::latency(plans, snap, events, l, names);
        left_out += k.rest.1 + k.not_split;
        let parts: Vec<bool> = plans.events[plan.event].key.iter().flatten().map(|p| p.key.depth().is_some()).collect();
        for (row, lat) in &k.rows {
            add_line(&mut lines, None, &row.cells, &parts, lat.total);
        }
    }
    lines.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    (lines, left_out)
}

/// The folded lines as text.
pub fn write(out: &mut String, lines: &[(String, u64)]) {
    for (line, count) in lines {
        let _ = writeln!(out, "{line} {count}");
    }
}

/// Adds `n` to the folded line of a key's `cells` (each stack cell's frames outermost
/// first, the other parts as frames of their own; `event`'s name first when given).
fn add_line(lines: &mut Vec<(String, u64)>, event: Option<&str>, cells: &[String], stacks: &[bool], n: u64) {
    let mut frames: Vec<String> = event.map(clean).into_iter().collect();
    for (cell, &stack) in cells.iter().zip(stacks) {
        match stack {
            true => frames.extend(cell.lines().rev().map(function)),
            false => frames.push(clean(cell)),
        }
    }
    let line = frames.join(";");
    match lines.iter_mut().find(|(l, _)| *l == line) {
        Some((_, count)) => *count += n,
        None => lines.push((line, n)),
    }
}

/// A frame as a report names it (`symbol+0xoff (module)`, with ` at FILE:LINE` where the
/// module has line tables, `FILE+0xoff`, or a marker) as a folded frame: the function alone,
/// where it has a name.
pub fn function(frame: &str) -> String {
    let frame = frame.find(") at ").map_or(frame, |i| &frame[..=i]);
    let named = frame.strip_suffix(')').and_then(|f| f.rsplit_once(" (")).map(|(f, _)| f);
    let name = match named {
        Some(f) => f.rsplit_once("+0x").map_or(f, |(sym, _)| sym),
        None => frame,
    };
    clean(name)
}

/// A frame or key part that cannot break a folded line: no `;`, no line end.
fn clean(text: &str) -> String {
    text.replace(';', ":").replace(['\n', '\r'], " ")
}

/// Draws `lines` as a flame graph SVG (inferno) into `path`, titled `title`; the error to
/// tell otherwise.
pub fn svg(path: &str, title: &str, lines: &[(String, u64)]) -> Result<(), String> {
    use inferno::flamegraph::{self, Options};
    let text: Vec<String> = lines.iter().map(|(l, n)| format!("{l} {n}")).collect();
    let file = std::fs::File::create(path).map_err(|e| format!("--flamegraph {path}: {e}"))?;
    let mut options = Options::default();
    options.title = title.to_string();
    options.count_name = "hits".to_string();
    // Frames keep the order the lines give (callers first), merged by name, as flamegraph.pl.
    let writer = std::io::BufWriter::new(file);
    flamegraph::from_lines(&mut options, text.iter().map(String::as_str), writer)
        .map_err(|e| format!("--flamegraph {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_fold_to_their_functions() {
        assert_eq!(function("leaf+0x0 (prog)"), "leaf");
        assert_eq!(function("leaf+0x0 (prog) at /src/prog.c:28"), "leaf");
        assert_eq!(function("ns::f(int)+0x1d (libx.so)"), "ns::f(int)");
        assert_eq!(function("sqlite3+0x200c4"), "sqlite3+0x200c4");
        assert_eq!(function("[stack unreadable from here]"), "[stack unreadable from here]");
        assert_eq!(function("0x1234"), "0x1234");
        assert_eq!(clean("a;b"), "a:b");
    }
}
