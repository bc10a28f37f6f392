//! DWARF location expressions at one address, turned into the places fetchargs read: a
//! register, memory at a register plus an offset (`+8(%di)`), memory at a file offset
//! (`@+0x4010`), a constant (`\3`), or nothing (`$optimized_out`). Pure: operations in, a
//! [`Loc`] out; what cannot be said exactly is refused, never guessed.

use gimli::{Operation, Reader, Register};

/// Where memory is: the address a fetcharg computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addr {
    /// The value of a register (`%di`).
    Reg(&'static str),
    /// The value a fetcharg reads (a pointer in memory: `+8(%di)`).
    Value(String),
    /// A file offset of the probed file (a global: `@+0x4010`).
    File(u64),
}

/// Where a variable's value is at the probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loc {
    /// In a register.
    Reg(&'static str),
    /// In memory at an address plus an offset.
    Mem(Addr, i64),
    /// A constant the compiler knows (`DW_AT_const_value`, `DW_OP_lit3; DW_OP_stack_value`).
    Const(u64),
    /// Not kept at the probe: no location covers the address.
    OptimizedOut,
}

impl Loc {
    /// The fetcharg that reads the value (without its type).
    pub fn fetcharg(&self) -> String {
        match self {
            Loc::Reg(r) => format!("%{r}"),
            Loc::Mem(a, off) => memory(a, *off),
            Loc::Const(v) => format!("\\{v}"),
            Loc::OptimizedOut => "$optimized_out".into(),
        }
    }

    /// The address this value points to, when it is a pointer.
    pub fn pointee(&self) -> Option<Addr> {
        match self {
            Loc::Reg(r) => Some(Addr::Reg(r)),
            Loc::Mem(a, off) => Some(Addr::Value(memory(a, *off))),
            Loc::Const(v) => Some(Addr::Value(format!("\\{v}"))),
            Loc::OptimizedOut => None,
        }
    }
}

/// The fetcharg reading memory at `a` plus `off`.
pub fn memory(a: &Addr, off: i64) -> String {
    match a {
        Addr::Reg(r) => format!("{off:+}(%{r})"),
        Addr::Value(f) => format!("{off:+}({f})"),
        Addr::File(o) => format!("@+{:#x}", o.wrapping_add(off as u64)),
    }
}

/// The x86-64 DWARF register numbers of the general registers, by the kernel's names.
const GENERAL: [&str; 16] =
    ["ax", "dx", "cx", "bx", "si", "di", "bp", "sp", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"];
/// DWARF registers 17..32: xmm0..xmm15.
const XMM: [&str; 16] = [
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",
    "xmm14", "xmm15",
];

/// The fetcharg name of DWARF register `r`, or why it cannot be read.
pub fn register(r: Register) -> Result<&'static str, String> {
    match r.0 {
        n @ 0..=15 => Ok(GENERAL[usize::from(n)]),
        n @ 17..=32 => Ok(XMM[usize::from(n - 17)]),
        n => Err(format!("its value is in DWARF register {n}, which fetchargs do not read")),
    }
}

/// The general register DWARF register `r` is (an address is never in a vector register).
pub fn general(r: Register) -> Result<&'static str, String> {
    match register(r)? {
        x if x.starts_with("xmm") => Err(format!("an address in %{x}")),
        g => Ok(g),
    }
}

/// What an expression needs from around it.
pub struct Context<'a> {
    /// The frame base (`DW_OP_fbreg`): a register and an offset, or why it is not known here.
    pub frame_base: Result<(&'static str, i64), String>,
    /// Whether the probe is at the function's entry, where `DW_OP_entry_value(reg)` is the register.
    pub at_entry: bool,
    /// A link-time address's file offset.
    pub file_offset: &'a dyn Fn(u64) -> Option<u64>,
    /// The variable's size in bytes (to accept a first piece that covers it whole).
    pub size: u64,
}

/// The place an expression's operations name at the probe.
pub fn place<R: Reader>(
    ops: &[Operation<R>],
    cx: &Context<'_>,
    inner: &dyn Fn(&R) -> Option<Vec<Operation<R>>>,
) -> Result<Loc, String> {
    if let Some(at) = ops.iter().position(|op| matches!(op, Operation::Piece { .. })) {
        // A value in pieces: taken only when its first piece holds it whole.
        return match &ops[at] {
            Operation::Piece { size_in_bits, bit_offset: None } if *size_in_bits >= cx.size * 8 => {
                place(&ops[..at], cx, inner)
            }
            _ => Err("its value is split into pieces (DW_OP_piece), which fetchargs do not join".into()),
        };
    }
    Ok(match ops {
        [] => Loc::OptimizedOut,
        [Operation::Register { register: r }] => Loc::Reg(register(*r)?),
        [Operation::RegisterOffset { register: r, offset, .. }] => Loc::Mem(Addr::Reg(general(*r)?), *offset),
        [Operation::RegisterOffset { register: r, offset: 0, .. }, Operation::StackValue] => Loc::Reg(general(*r)?),
        [Operation::FrameOffset { offset }] => {
            let (r, base) = cx.frame_base.clone()?;
            Loc::Mem(Addr::Reg(r), base + offset)
        }
        [Operation::Address { address }] => {
            Loc::Mem(Addr::File((cx.file_offset)(*address).ok_or("its address lies outside the file's segments")?), 0)
        }
        [Operation::UnsignedConstant { value }, Operation::StackValue] => Loc::Const(*value),
        [Operation::SignedConstant { value }, Operation::StackValue] => Loc::Const(*value as u64),
        [Operation::ImplicitValue { data }] => {
            let bytes = data.to_slice().map_err(|e| e.to_string())?;
            let mut b = [0u8; 8];
            let n = bytes.len().min(8);
            b[..n].copy_from_slice(&bytes[..n]);
            Loc::Const(u64::from_le_bytes(b))
        }
        [Operation::EntryValue { expression }, Operation::StackValue] => {
            if !cx.at_entry {
                return Err(
                    "its value is the one it had at the function's entry (DW_OP_entry_value), not kept here".into()
                );
            }
            match inner(expression).as_deref() {
                Some([Operation::Register { register: r }]) => Loc::Reg(register(*r)?),
                _ => return Err("an entry value other than a register's".into()),
            }
        }
        _ => return Err(format!("a location expression fetchargs cannot follow ({})", names(ops))),
    })
}

/// The operations' names, for a refusal.
fn names<R: Reader>(ops: &[Operation<R>]) -> String {
    ops.iter()
        .map(|op| {
            let d = format!("{op:?}");
            d.split([' ', '{', '(']).next().unwrap_or("").to_string()
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The frame base's register and offset from the function's `DW_AT_frame_base` operations,
/// given the CFA at the probe (from `.eh_frame`).
pub fn frame_base<R: Reader>(
    ops: &[Operation<R>],
    cfa: Result<(&'static str, i64), String>,
) -> Result<(&'static str, i64), String> {
    match ops {
        [Operation::CallFrameCFA] => cfa,
        [Operation::Register { register: r }] => Ok((general(*r)?, 0)),
        [Operation::RegisterOffset { register: r, offset, .. }] => Ok((general(*r)?, *offset)),
        _ => Err(format!("the function's frame base is {}, which fetchargs cannot follow", names(ops))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gimli::{EndianSlice, LittleEndian, UnitOffset};

    type Op = Operation<EndianSlice<'static, LittleEndian>>;

    fn cx(at_entry: bool) -> Context<'static> {
        Context {
            frame_base: Ok(("sp", 8)),
            at_entry,
            file_offset: &|a| a.checked_sub(0x1000).map(|o| o + 0x200),
            size: 8,
        }
    }

    fn at(ops: &[Op], entry: bool) -> Result<Loc, String> {
        let inner = |_: &EndianSlice<'static, LittleEndian>| Some(vec![Op::Register { register: Register(5) }]);
        place(ops, &cx(entry), &inner)
    }

    #[test]
    fn registers_and_memory() {
        assert_eq!(at(&[Op::Register { register: Register(5) }], true).unwrap().fetcharg(), "%di");
        assert_eq!(at(&[Op::Register { register: Register(14) }], true).unwrap().fetcharg(), "%r14");
        let breg = Op::RegisterOffset { register: Register(7), offset: -16, base_type: UnitOffset(0) };
        assert_eq!(at(&[breg], true).unwrap().fetcharg(), "-16(%sp)");
        assert_eq!(at(&[Op::FrameOffset { offset: -20 }], true).unwrap().fetcharg(), "-12(%sp)");
        assert_eq!(at(&[Op::Address { address: 0x1010 }], true).unwrap().fetcharg(), "@+0x210");
        assert_eq!(at(&[], true).unwrap(), Loc::OptimizedOut);
        assert_eq!(at(&[Op::UnsignedConstant { value: 3 }, Op::StackValue], true).unwrap().fetcharg(), "\\3");
        let bx0 = Op::RegisterOffset { register: Register(3), offset: 0, base_type: UnitOffset(0) };
        assert_eq!(at(&[bx0, Op::StackValue], true).unwrap().fetcharg(), "%bx");
    }

    #[test]
    fn entry_values_only_at_the_entry() {
        let ev = [Op::EntryValue { expression: EndianSlice::new(&[0x55], LittleEndian) }, Op::StackValue];
        assert_eq!(at(&ev, true).unwrap().fetcharg(), "%di");
        assert!(at(&ev, false).unwrap_err().contains("entry_value"));
    }

    #[test]
    fn pieces_and_refusals() {
        let whole = [Op::Register { register: Register(0) }, Op::Piece { size_in_bits: 64, bit_offset: None }];
        assert_eq!(at(&whole, true).unwrap().fetcharg(), "%ax");
        let split = [
            Op::Register { register: Register(0) },
            Op::Piece { size_in_bits: 32, bit_offset: None },
            Op::Register { register: Register(1) },
            Op::Piece { size_in_bits: 32, bit_offset: None },
        ];
        assert!(at(&split, true).unwrap_err().contains("pieces"));
        assert_eq!(at(&[Op::Register { register: Register(18) }], true).unwrap().fetcharg(), "%xmm1");
        let computed =
            [Op::RegisterOffset { register: Register(5), offset: 4, base_type: UnitOffset(0) }, Op::StackValue];
        assert!(at(&computed, true).unwrap_err().contains("cannot follow"));
        let no_fb = Context { frame_base: Err("no frame base".into()), ..cx(true) };
        assert_eq!(place(&[Op::FrameOffset { offset: 0 }], &no_fb, &|_| None).unwrap_err(), "no frame base");
    }

    #[test]
    fn pointers_chain_through_memory() {
        let b = Loc::Reg("di");
        let data = Loc::Mem(b.pointee().unwrap(), 8);
        assert_eq!(data.fetcharg(), "+8(%di)");
        let first = Loc::Mem(data.pointee().unwrap(), 0);
        assert_eq!(first.fetcharg(), "+0(+8(%di))");
        assert_eq!(Loc::Mem(Addr::File(0x4010), 8).fetcharg(), "@+0x4018");
        assert_eq!(Loc::OptimizedOut.pointee(), None);
        assert_eq!(
            frame_base::<EndianSlice<'static, LittleEndian>>(&[Operation::CallFrameCFA], Ok(("sp", 8))),
            Ok(("sp", 8))
        );
    }
}
