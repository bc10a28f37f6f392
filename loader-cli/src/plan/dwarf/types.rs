//! The C types of a compilation unit, read once from its DWARF into owned values, so the
//! translation of a variable's accesses (`b->arr[2]`, `p.in.s`) works on plain data.
//!
//! A type is known by its offset in `.debug_info`, so one table holds the types of several
//! units: a link-time optimized function takes its variables' types from the units it was
//! compiled from.

use std::collections::HashMap;

use gimli::{AttributeValue, EndianSlice, LittleEndian, UnitOffset};

use super::units::global;

type R<'a> = EndianSlice<'a, LittleEndian>;

/// One type, as fetchargs need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ty {
    /// An integer, `bool` or character type of `size` bytes.
    Int {
        size: u8,
        signed: bool,
        boolean: bool,
    },
    /// `float`, `double`, `long double`.
    Float {
        size: u8,
    },
    Pointer {
        to: Option<UnitOffset>,
    },
    /// A struct, union or class.
    Struct {
        size: u64,
        members: Vec<Member>,
    },
    Array {
        elem: Option<UnitOffset>,
        count: Option<u64>,
    },
    Enum {
        size: u8,
        signed: bool,
        values: Vec<(String, i64)>,
    },
    /// `typedef`, `const`, `volatile`, `restrict`, `_Atomic`: the type they name.
    Alias {
        to: Option<UnitOffset>,
    },
    /// What fetchargs do not read (functions, void, ...).
    Other,
}

/// A member of a struct or union.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// Bytes from the start of the struct.
    pub offset: u64,
    pub ty: Option<UnitOffset>,
    /// A bitfield: (width, bit offset from the start of its byte at `offset`).
    pub bits: Option<(u8, u8)>,
}

/// The types of one unit, with their C names.
#[derive(Default)]
pub struct Table {
    tys: HashMap<UnitOffset, Ty>,
    names: HashMap<UnitOffset, String>,
    /// Alias qualifiers, spelled: `const`, `volatile`, or a typedef's name.
    alias: HashMap<UnitOffset, &'static str>,
}

fn udata(v: Option<AttributeValue<R<'_>>>) -> Option<u64> {
    match v? {
        AttributeValue::Sdata(s) if s >= 0 => Some(s as u64),
        v => v.udata_value(),
    }
}

/// The `.debug_info` offset of the DIE a reference read in `unit` names.
fn unit_ref(unit: &gimli::Unit<R<'_>>, v: Option<AttributeValue<R<'_>>>) -> Option<UnitOffset> {
    match v? {
        AttributeValue::UnitRef(o) => Some(global(unit, o)),
        AttributeValue::DebugInfoRef(o) => Some(UnitOffset(o.0)),
        _ => None,
    }
}

impl Table {
    /// Reads every type of `unit`.
    pub fn read(dwarf: &gimli::Dwarf<R<'_>>, unit: &gimli::Unit<R<'_>>) -> Table {
        let mut t = Table::default();
        t.add(dwarf, unit);
        t
    }

    /// Reads every type of `unit` into the table.
    pub fn add(&mut self, dwarf: &gimli::Dwarf<R<'_>>, unit: &gimli::Unit<R<'_>>) {
        let Ok(mut tree) = unit.entries_tree(None) else { return };
        if let Ok(root) = tree.root() {
            self.walk(dwarf, unit, root);
        }
    }

    /// Whether the type at `off` has been read.
    pub fn has(&self, off: UnitOffset) -> bool {
        self.tys.contains_key(&off)
    }

    /// The types that the types read name and that are not read (in other units).
    pub fn missing(&self) -> Vec<UnitOffset> {
        let mut out = Vec::new();
        for t in self.tys.values() {
            match t {
                Ty::Pointer { to } | Ty::Alias { to } | Ty::Array { elem: to, .. } => out.extend(*to),
                Ty::Struct { members, .. } => out.extend(members.iter().filter_map(|m| m.ty)),
                _ => {}
            }
        }
        out.retain(|o| !self.tys.contains_key(o));
        out
    }

    fn walk(
        &mut self,
        dwarf: &gimli::Dwarf<R<'_>>,
        unit: &gimli::Unit<R<'_>>,
        node: gimli::EntriesTreeNode<'_, '_, '_, R<'_>>,
    ) {
        let e = node.entry().clone();
        let at = |a| e.attr_value(a).ok().flatten();
        let name = at(gimli::DW_AT_name)
            .and_then(|v| dwarf.attr_string(unit, v).ok())
            .map(|s| s.to_string_lossy().into_owned());
        let size = udata(at(gimli::DW_AT_byte_size));
        let to = unit_ref(unit, at(gimli::DW_AT_type));
        let off = global(unit, e.offset());
        let mut members = Vec::new();
        let mut values = Vec::new();
        let mut count = None;
        let mut children = node.children();
        let tag = e.tag();
        while let Ok(Some(child)) = children.next() {
            let c = child.entry();
            let cat = |a| c.attr_value(a).ok().flatten();
            let cname = cat(gimli::DW_AT_name)
                .and_then(|v| dwarf.attr_string(unit, v).ok())
                .map(|s| s.to_string_lossy().into_owned());
            match c.tag() {
                gimli::DW_TAG_member => {
                    let bit_size = udata(cat(gimli::DW_AT_bit_size));
                    let data_bit = udata(cat(gimli::DW_AT_data_bit_offset));
                    let byte = udata(cat(gimli::DW_AT_data_member_location));
                    let (offset, bits) = match (bit_size, data_bit) {
                        (Some(w), Some(b)) => (b / 8, Some((w as u8, (b % 8) as u8))),
                        (Some(w), None) => (byte.unwrap_or(0), Some((w as u8, 0))),
                        _ => (byte.unwrap_or(0), None),
                    };
                    members.push(Member {
                        name: cname.unwrap_or_default(),
                        offset,
                        ty: unit_ref(unit, cat(gimli::DW_AT_type)),
                        bits,
                    });
                }
                gimli::DW_TAG_enumerator => {
                    let v = match cat(gimli::DW_AT_const_value) {
                        Some(AttributeValue::Sdata(s)) => s,
                        v => v.and_then(|v| v.udata_value()).unwrap_or(0) as i64,
                    };
                    values.push((cname.unwrap_or_default(), v));
                }
                gimli::DW_TAG_subrange_type if count.is_none() => {
                    count =
                        udata(cat(gimli::DW_AT_count)).or_else(|| udata(cat(gimli::DW_AT_upper_bound)).map(|u| u + 1));
                }
                _ => {}
            }
            // Types nested in structs and functions.
            if !matches!(c.tag(), gimli::DW_TAG_member | gimli::DW_TAG_enumerator | gimli::DW_TAG_subrange_type) {
                self.walk(dwarf, unit, child);
            }
        }
        let ty = match tag {
            gimli::DW_TAG_base_type => {
                let enc = match at(gimli::DW_AT_encoding) {
                    Some(AttributeValue::Encoding(e)) => e,
                    _ => gimli::DW_ATE_signed,
                };
                let size = size.unwrap_or(0) as u8;
                match enc {
                    gimli::DW_ATE_float => Ty::Float { size },
                    gimli::DW_ATE_boolean => Ty::Int { size, signed: false, boolean: true },
                    gimli::DW_ATE_signed | gimli::DW_ATE_signed_char => Ty::Int { size, signed: true, boolean: false },
                    gimli::DW_ATE_unsigned | gimli::DW_ATE_unsigned_char | gimli::DW_ATE_UTF => {
                        Ty::Int { size, signed: false, boolean: false }
                    }
                    _ => Ty::Other,
                }
            }
            gimli::DW_TAG_pointer_type | gimli::DW_TAG_reference_type | gimli::DW_TAG_rvalue_reference_type => {
                Ty::Pointer { to }
            }
            gimli::DW_TAG_structure_type | gimli::DW_TAG_union_type | gimli::DW_TAG_class_type => {
                Ty::Struct { size: size.unwrap_or(0), members }
            }
            gimli::DW_TAG_array_type => Ty::Array { elem: to, count },
            gimli::DW_TAG_enumeration_type => {
                let signed = values.iter().any(|&(_, v)| v < 0);
                Ty::Enum { size: size.unwrap_or(4) as u8, signed, values }
            }
            gimli::DW_TAG_typedef => {
                if let Some(n) = &name {
                    self.names.insert(off, n.clone());
                }
                Ty::Alias { to }
            }
            gimli::DW_TAG_const_type
            | gimli::DW_TAG_volatile_type
            | gimli::DW_TAG_restrict_type
            | gimli::DW_TAG_atomic_type => {
                self.alias.insert(
                    off,
                    match tag {
                        gimli::DW_TAG_const_type => "const ",
                        gimli::DW_TAG_volatile_type => "volatile ",
                        _ => "",
                    },
                );
                Ty::Alias { to }
            }
            gimli::DW_TAG_subroutine_type => Ty::Other,
            _ => return,
        };
        if let Some(n) = name {
            let n = match tag {
                gimli::DW_TAG_structure_type => format!("struct {n}"),
                gimli::DW_TAG_union_type => format!("union {n}"),
                gimli::DW_TAG_enumeration_type => format!("enum {n}"),
                _ => n,
            };
            self.names.insert(off, n);
        }
        self.tys.insert(off, ty);
    }

    /// The type at `off`, through typedefs and qualifiers (None: void or unknown).
    pub fn strip(&self, mut off: Option<UnitOffset>) -> Option<&Ty> {
        for _ in 0..16 {
            match self.tys.get(&off?)? {
                Ty::Alias { to } => off = *to,
                t => return Some(t),
            }
        }
        None
    }

    /// The C name of a type (`char*`, `struct buf*`, `unsigned int`), as `perf probe -V` shows it.
    pub fn name(&self, off: Option<UnitOffset>) -> String {
        let Some(o) = off else { return "void".into() };
        if let Some(n) = self.names.get(&o) {
            return n.clone();
        }
        match self.tys.get(&o) {
            Some(Ty::Pointer { to }) => format!("{}*", self.name(*to)),
            Some(Ty::Array { elem, count }) => {
                format!("{}[{}]", self.name(*elem), count.map_or(String::new(), |c| c.to_string()))
            }
            Some(Ty::Alias { to }) => {
                let (qualifier, inner) = (self.alias.get(&o).copied().unwrap_or(""), self.name(*to));
                // A const array of const elements is spelled once, as gdb does.
                match inner.starts_with(qualifier) {
                    true => inner,
                    false => format!("{qualifier}{inner}"),
                }
            }
            Some(Ty::Struct { .. }) => "struct (anonymous)".into(),
            Some(Ty::Enum { .. }) => "enum (anonymous)".into(),
            _ => "(unknown)".into(),
        }
    }

    /// Whether `off` is a pointer to `char` (through typedefs and qualifiers: `const char *`),
    /// which is shown as the text it points to. `unsigned char *` and `uint8_t *` are bytes.
    pub fn is_char_pointer(&self, off: Option<UnitOffset>) -> bool {
        let Some(Ty::Pointer { to }) = self.strip(off) else { return false };
        let mut at = *to;
        for _ in 0..16 {
            match at.and_then(|o| self.tys.get(&o).map(|t| (o, t))) {
                Some((_, Ty::Alias { to })) => at = *to,
                Some((o, Ty::Int { size: 1, boolean: false, .. })) => {
                    return self.names.get(&o).is_some_and(|n| n == "char")
                }
                _ => return false,
            }
        }
        false
    }

    /// The size in bytes of a type.
    pub fn size(&self, off: Option<UnitOffset>) -> Option<u64> {
        Some(match self.strip(off)? {
            Ty::Int { size, .. } | Ty::Float { size } | Ty::Enum { size, .. } => u64::from(*size),
            Ty::Pointer { .. } => 8,
            Ty::Struct { size, .. } => *size,
            Ty::Array { elem, count } => self.size(*elem)? * (*count)?,
            Ty::Alias { .. } | Ty::Other => return None,
        })
    }
}
