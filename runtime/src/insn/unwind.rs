//! Call-frame information made into rows a hit can evaluate: for every address range of a
//! module's `.eh_frame`, how to find the caller's `%rip`, `%rsp` and `%rbp` from the frame's.
//!
//! The tables are compiled once per module, when it is loaded (with gimli, which allocates
//! and keeps a context: fine there); a hit then only binary-searches a sorted slice and
//! applies one [`Rule`] per frame ([`step`]), reading the stack through a caller-given
//! function (the fault-safe copy). x86_64 code as compilers emit it needs only `%rsp` or
//! `%rbp` as the CFA's base, the return address at a fixed offset from the CFA, and `%rbp`'s
//! save slot to follow the next frames; three forms are special: the PLT's CFA expression, a
//! signal frame (`__restore_rt`, whose CIE says `S`), and the outermost frame (return address
//! undefined: `_start`, `clone`). Any other rule ends the stack there. Pure.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, LittleEndian, RegisterRule, UnwindContext, UnwindSection, X86_64,
};
use object::{Object, ObjectSection};

/// How to find a frame's caller, for the addresses from one row's start to the next's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// CFA = `%rsp` (or `%rbp` when `rbp_based`) + `cfa`; return address at CFA + `ra`;
    /// the caller's `%rbp` at CFA + `rbp`, or unchanged when `rbp` is 0.
    Cfa { rbp_based: bool, cfa: i32, ra: i16, rbp: i16 },
    /// A PLT entry: CFA = `%rsp` + 8, plus 8 from byte `threshold` of each 16-byte entry on.
    Plt { threshold: u8 },
    /// A signal frame: the interrupted registers are in the `ucontext_t` at `%rsp`.
    Signal,
    /// The outermost frame.
    End,
    /// No rule that can be followed here (no FDE, or one this evaluator does not read).
    Unknown,
    /// A module without call-frame information: the caller by the frame-pointer chain.
    FramePointers,
}

/// A rule and the first link-time address it holds for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub start: u64,
    pub rule: Rule,
}

/// The registers an unwind follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    pub rip: u64,
    pub rsp: u64,
    pub rbp: u64,
}

/// One step of an unwind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The caller's registers; `slot`: where its return address was read (0 for a signal
    /// frame, whose `rip` is the interrupted instruction, not a return address).
    Caller { regs: Regs, slot: u64 },
    /// The outermost frame, or a frame no rule covers.
    End,
    /// The stack could not be read where the rule says.
    Fault,
}

/// `ucontext_t.uc_mcontext.gregs` on x86_64, and the indices of `%rbp`, `%rsp`, `%rip`.
const GREGS: u64 = 40;
const REG_RBP: u64 = 10;
const REG_RSP: u64 = 15;
const REG_RIP: u64 = 16;

/// The caller of the frame at `r` under `rule`; `read` gives the 8 bytes at an address.
#[inline(always)]
pub fn step(rule: Rule, r: &Regs, read: &mut impl FnMut(u64) -> Option<u64>) -> Step {
    let (cfa, ra_at, rbp_at) = match rule {
        Rule::Cfa { rbp_based, cfa, ra, rbp } => {
            let base = if rbp_based { r.rbp } else { r.rsp };
            let c = base.wrapping_add(cfa as i64 as u64);
            (c, c.wrapping_add(ra as i64 as u64), (rbp != 0).then(|| c.wrapping_add(rbp as i64 as u64)))
        }
        Rule::Plt { threshold } => {
            let extra = if (r.rip & 15) as u8 >= threshold { 8 } else { 0 };
            let c = r.rsp.wrapping_add(8 + extra);
            (c, c.wrapping_sub(8), None)
        }
        Rule::Signal => {
            let at = |i: u64| r.rsp.wrapping_add(GREGS + 8 * i);
            let (Some(rip), Some(rsp), Some(rbp)) = (read(at(REG_RIP)), read(at(REG_RSP)), read(at(REG_RBP))) else {
                return Step::Fault;
            };
            return Step::Caller { regs: Regs { rip, rsp, rbp }, slot: 0 };
        }
        Rule::FramePointers => return frame_pointer_step(r, read),
        Rule::End | Rule::Unknown => return Step::End,
    };
    let Some(rip) = read(ra_at) else { return Step::Fault };
    let rbp = match rbp_at {
        Some(at) => match read(at) {
            Some(v) => v,
            None => return Step::Fault,
        },
        None => r.rbp,
    };
    Step::Caller { regs: Regs { rip, rsp: cfa, rbp }, slot: ra_at }
}

/// The caller by the frame-pointer chain, for code without call-frame information.
#[inline]
pub fn frame_pointer_step(r: &Regs, read: &mut impl FnMut(u64) -> Option<u64>) -> Step {
    if r.rbp < r.rsp || r.rbp & 7 != 0 {
        return Step::End;
    }
    match (read(r.rbp.wrapping_add(8)), read(r.rbp)) {
        (Some(rip), Some(rbp)) => Step::Caller { regs: Regs { rip, rsp: r.rbp + 16, rbp }, slot: r.rbp + 8 },
        _ => Step::Fault,
    }
}

/// Rows laid out for lookups that touch few cache lines: the starts apart from the rules, as
/// 32-bit offsets from the first, and per 4 KiB of code the first row that may hold it, so a
/// lookup searches a handful of neighbouring starts instead of the whole table. Each row
/// names its rule by an index into the table's distinct rules ([`Table::rules`], `Unknown`
/// first), which a caller can keep in one word beside an address.
#[derive(Debug)]
pub struct Table {
    base: u64,
    starts: Vec<u32>,
    ids: Vec<u32>,
    /// The distinct rules; index 0 is `Unknown`.
    rules: Vec<Rule>,
    /// Per page from `base`: the index of the row holding the page's first byte.
    pages: Vec<u32>,
}

impl Default for Table {
    fn default() -> Table {
        Table { base: 0, starts: Vec::new(), ids: Vec::new(), rules: vec![Rule::Unknown], pages: Vec::new() }
    }
}

const PAGE_SHIFT: u32 = 12;

impl Table {
    /// The table of `rows` (sorted by start); rows beyond 4 GiB from the first are left out.
    pub fn new(rows: &[Row]) -> Table {
        let Some(first) = rows.first() else { return Table::default() };
        let base = first.start;
        let rows: Vec<&Row> = rows.iter().take_while(|r| r.start - base <= u64::from(u32::MAX)).collect();
        let starts: Vec<u32> = rows.iter().map(|r| (r.start - base) as u32).collect();
        let last = u64::from(*starts.last().unwrap_or(&0));
        let pages = (0..=(last >> PAGE_SHIFT))
            .map(|p| starts.partition_point(|&s| u64::from(s) <= p << PAGE_SHIFT).saturating_sub(1) as u32)
            .collect();
        let mut rules = vec![Rule::Unknown];
        let mut known = std::collections::HashMap::from([(Rule::Unknown, 0u32)]);
        let ids = rows
            .iter()
            .map(|r| {
                *known.entry(r.rule).or_insert_with(|| {
                    rules.push(r.rule);
                    (rules.len() - 1) as u32
                })
            })
            .collect();
        Table { base, starts, ids, rules, pages }
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The distinct rules of the table, `Unknown` first: what [`Table::id_at`] indexes.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rule for link-time address `pc` (hit path: no allocation).
    pub fn rule_at(&self, pc: u64) -> Rule {
        self.rules[self.id_at(pc) as usize]
    }

    /// The index in [`Table::rules`] of the rule for link-time address `pc` (hit path).
    pub fn id_at(&self, pc: u64) -> u32 {
        let Some(off) = pc.checked_sub(self.base).filter(|&o| o <= u64::from(u32::MAX)) else { return 0 };
        let page = (off >> PAGE_SHIFT) as usize;
        let Some(&from) = self.pages.get(page) else {
            return self.ids.last().copied().unwrap_or(0);
        };
        let to = self.pages.get(page + 1).map_or(self.starts.len(), |&t| t as usize + 1);
        let from = from as usize;
        let i = self.starts[from..to].partition_point(|&s| u64::from(s) <= off);
        if from + i == 0 {
            0
        } else {
            self.ids[from + i - 1]
        }
    }
}

/// The rule for link-time address `pc` in `rows` (sorted by start).
pub fn rule_at(rows: &[Row], pc: u64) -> Rule {
    let i = rows.partition_point(|r| r.start <= pc);
    if i == 0 {
        Rule::Unknown
    } else {
        rows[i - 1].rule
    }
}

/// The rows of ELF image `data` (a file, or the vDSO's bytes), sorted; None when it has no
/// readable `.eh_frame`.
pub fn compile(data: &[u8]) -> Option<Vec<Row>> {
    let file = object::File::parse(data).ok()?;
    let section = file.section_by_name(".eh_frame")?;
    let bytes = section.data().ok()?;
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    let rows = rows(bytes, &bases);
    (!rows.is_empty()).then_some(rows)
}

/// The rows of an `.eh_frame` section's bytes.
fn rows(bytes: &[u8], bases: &BaseAddresses) -> Vec<Row> {
    let eh_frame = EhFrame::new(bytes, LittleEndian);
    let mut ctx = Box::new(UnwindContext::new());
    let mut spans: Vec<(u64, u64, Vec<Row>)> = Vec::new();
    let mut entries = eh_frame.entries(bases);
    // A malformed entry ends the walk: what was read before it stands.
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else { continue };
        let Ok(fde) = partial.parse(|section, bases, offset| section.cie_from_offset(bases, offset)) else { continue };
        if fde.len() == 0 {
            continue;
        }
        let signal = fde.is_signal_trampoline();
        let Ok(mut table) = fde.rows(&eh_frame, bases, &mut ctx) else { continue };
        let mut out = Vec::new();
        while let Ok(Some(row)) = table.next_row() {
            let rule = if signal { Rule::Signal } else { rule_of(row, &eh_frame) };
            if out.last().is_none_or(|r: &Row| r.rule != rule) {
                out.push(Row { start: row.start_address(), rule });
            }
        }
        spans.push((fde.initial_address(), fde.initial_address().saturating_add(fde.len()), out));
    }
    spans.sort_unstable_by_key(|s| s.0);
    let mut rows: Vec<Row> = Vec::new();
    let mut covered_to = 0;
    for (start, end, out) in spans {
        if start < covered_to {
            continue; // overlapping FDEs: the first one stands
        }
        rows.extend(out);
        rows.push(Row { start: end, rule: Rule::Unknown });
        covered_to = end;
    }
    // An Unknown row followed by a row at the same address: the later one stands.
    let mut kept: Vec<Row> = Vec::with_capacity(rows.len());
    for r in rows {
        match kept.last_mut() {
            Some(last) if last.start == r.start => *last = r,
            Some(last) if last.rule == r.rule => {}
            _ => kept.push(r),
        }
    }
    kept
}

fn rule_of<R: gimli::Reader>(row: &gimli::UnwindTableRow<R::Offset>, eh_frame: &EhFrame<R>) -> Rule {
    let ra = match row.register(X86_64::RA) {
        RegisterRule::Undefined => return Rule::End,
        RegisterRule::Offset(o) => o,
        _ => return Rule::Unknown,
    };
    match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let rbp_based = match *register {
                X86_64::RSP => false,
                X86_64::RBP => true,
                _ => return Rule::Unknown,
            };
            let rbp = match row.register(X86_64::RBP) {
                RegisterRule::Undefined | RegisterRule::SameValue => 0,
                RegisterRule::Offset(o) if o != 0 => o,
                _ => return Rule::Unknown,
            };
            match (i32::try_from(*offset), i16::try_from(ra), i16::try_from(rbp)) {
                (Ok(cfa), Ok(ra), Ok(rbp)) => Rule::Cfa { rbp_based, cfa, ra, rbp },
                _ => Rule::Unknown,
            }
        }
        CfaRule::Expression(expr) => {
            let Ok(expr) = expr.get(eh_frame) else { return Rule::Unknown };
            let Ok(bytes) = expr.0.to_slice() else { return Rule::Unknown };
            plt_threshold(&bytes).map_or(Rule::Unknown, |threshold| Rule::Plt { threshold })
        }
    }
}

/// The PLT's CFA expression as GNU ld writes it: `DW_OP_breg7 8; DW_OP_breg16 0;
/// DW_OP_lit15; DW_OP_and; DW_OP_litN; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`: N.
fn plt_threshold(bytes: &[u8]) -> Option<u8> {
    const LIT0: u8 = 0x30;
    match bytes {
        [0x77, 8, 0x80, 0, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22] if (LIT0..LIT0 + 32).contains(lit) => {
            Some(lit - LIT0)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(words: &[(u64, u64)]) -> impl FnMut(u64) -> Option<u64> + '_ {
        move |at| words.iter().find(|w| w.0 == at).map(|w| w.1)
    }

    #[test]
    fn cfa_rules_give_the_callers_registers() {
        let r = Regs { rip: 0x1010, rsp: 0x7000, rbp: 0x9999 };
        // After `push %rbp`: CFA = rsp + 16, RA at CFA - 8, rbp at CFA - 16.
        let rule = Rule::Cfa { rbp_based: false, cfa: 16, ra: -8, rbp: -16 };
        let got = step(rule, &r, &mut stack(&[(0x7008, 0x4444), (0x7000, 0x7100)]));
        assert_eq!(got, Step::Caller { regs: Regs { rip: 0x4444, rsp: 0x7010, rbp: 0x7100 }, slot: 0x7008 });
        // At a function's first instruction: CFA = rsp + 8, rbp unchanged.
        let rule = Rule::Cfa { rbp_based: false, cfa: 8, ra: -8, rbp: 0 };
        let got = step(rule, &r, &mut stack(&[(0x7000, 0x5555)]));
        assert_eq!(got, Step::Caller { regs: Regs { rip: 0x5555, rsp: 0x7008, rbp: 0x9999 }, slot: 0x7000 });
        // An unreadable slot is a fault, not a frame.
        assert_eq!(step(rule, &r, &mut stack(&[])), Step::Fault);
        assert_eq!(step(Rule::End, &r, &mut stack(&[])), Step::End);
    }

    #[test]
    fn signal_frames_and_plt_entries() {
        let r = Regs { rip: 0x1000, rsp: 0x7000, rbp: 0 };
        let words = [(0x7000 + 40 + 16 * 8, 0xaaaa), (0x7000 + 40 + 15 * 8, 0x8000), (0x7000 + 40 + 10 * 8, 0x8100)];
        let got = step(Rule::Signal, &r, &mut stack(&words));
        assert_eq!(got, Step::Caller { regs: Regs { rip: 0xaaaa, rsp: 0x8000, rbp: 0x8100 }, slot: 0 });
        let plt = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
        assert_eq!(plt_threshold(&plt), Some(11));
        let at = |rip| step(Rule::Plt { threshold: 11 }, &Regs { rip, rsp: 0x7000, rbp: 0 }, &mut |a| Some(a));
        assert_eq!(at(0x1004), Step::Caller { regs: Regs { rip: 0x7000, rsp: 0x7008, rbp: 0 }, slot: 0x7000 });
        assert_eq!(at(0x100b), Step::Caller { regs: Regs { rip: 0x7008, rsp: 0x7010, rbp: 0 }, slot: 0x7008 });
    }

    #[test]
    fn a_table_finds_the_rule_a_search_of_the_rows_finds() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let rows = compile(&exe).unwrap();
        let table = Table::new(&rows);
        let (first, last) = (rows[0].start, rows[rows.len() - 1].start);
        for pc in (first.saturating_sub(64)..last + 64).step_by(7) {
            assert_eq!(table.rule_at(pc), rule_at(&rows, pc), "{pc:#x}");
        }
        // Each distinct rule once, Unknown first.
        let distinct: std::collections::HashSet<Rule> = rows.iter().map(|r| r.rule).collect();
        assert_eq!(table.rules()[0], Rule::Unknown);
        assert_eq!(table.rules().len(), distinct.len() + usize::from(!distinct.contains(&Rule::Unknown)));
    }

    #[test]
    fn this_test_binarys_tables_cover_its_functions() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let rows = compile(&exe).unwrap();
        assert!(rows.windows(2).all(|w| w[0].start < w[1].start));
        let here = this_test_binarys_tables_cover_its_functions as *const () as u64;
        // Link-time address of this function: the run-time one less the load bias, which
        // the FDE ranges place somewhere; every function's entry has a rule with RA at CFA-8.
        let entries = rows.iter().filter(|r| matches!(r.rule, Rule::Cfa { rbp_based: false, cfa: 8, ra: -8, .. }));
        assert!(entries.count() > 100, "{here:#x}");
    }
}
