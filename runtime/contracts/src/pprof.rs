//! Profiles as pprof reads them: the `profile.proto` message of
//! <https://github.com/google/pprof/blob/main/proto/profile.proto>, encoded by hand (varints
//! and length-delimited fields: the few the profile needs), and decoded back by the same
//! module: the tests read what the runtime writes, and `uprobe-run` checks what an attach
//! session's process sends before it writes the file.
//!
//! A [`Profile`] numbers its mappings, locations and functions from 1, in order (the id of
//! each is its index plus 1, as pprof allows); the string table is built at encoding, `""` first. Decoding reads
//! exactly that shape, bounded by the bytes it is given, and never panics.

/// A value type: what a sample's value counts (`hits`) and its unit (`count`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValueType {
    /// What is counted.
    pub kind: String,
    /// Its unit.
    pub unit: String,
}

/// One sample: a stack (location ids, innermost first) and its values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Location ids, the innermost frame first.
    pub locations: Vec<u64>,
    /// One value per sample type.
    pub values: Vec<i64>,
    /// Labels: a key and a text value each.
    pub labels: Vec<(String, String)>,
}

/// A mapped module: its address range and where it starts in its file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub limit: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// The module's path.
    pub file: String,
    /// The module's build ID, in hex (empty: unknown).
    pub build_id: String,
    /// Its locations have function names.
    pub has_functions: bool,
    /// Its functions have file names.
    pub has_filenames: bool,
    /// Its locations have line numbers.
    pub has_line_numbers: bool,
}

/// A line of a location: a function and a line in it (0: unknown).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Line {
    /// Function id.
    pub function: u64,
    /// Line number, 0 if unknown.
    pub line: i64,
}

/// A code address in a mapping.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Location {
    /// Mapping id, 0 if none.
    pub mapping: u64,
    /// The address.
    pub address: u64,
    /// What the address is in (the innermost inlined function first).
    pub lines: Vec<Line>,
}

/// A function: its name and source file (empty: unknown).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Function {
    /// Name.
    pub name: String,
    /// Source file.
    pub file: String,
}

/// A profile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// What each value of a sample is.
    pub sample_types: Vec<ValueType>,
    /// The samples.
    pub samples: Vec<Sample>,
    /// Mappings, id = index + 1.
    pub mappings: Vec<Mapping>,
    /// Locations, id = index + 1.
    pub locations: Vec<Location>,
    /// Functions, id = index + 1.
    pub functions: Vec<Function>,
    /// When the profile was taken (ns since the epoch, 0: unknown).
    pub time_nanos: i64,
    /// Over how long (ns).
    pub duration_nanos: i64,
}

impl Profile {
    /// The id of the function `name` in `file`, added if new.
    pub fn function(&mut self, name: &str, file: &str) -> u64 {
        match self.functions.iter().position(|f| f.name == name && f.file == file) {
            Some(i) => i as u64 + 1,
            None => {
                self.functions.push(Function { name: name.into(), file: file.into() });
                self.functions.len() as u64
            }
        }
    }

    /// The id of the mapping starting at `m.start`, `m` added if new.
    pub fn mapping(&mut self, m: Mapping) -> u64 {
        match self.mappings.iter().position(|k| k.start == m.start) {
            Some(i) => i as u64 + 1,
            None => {
                self.mappings.push(m);
                self.mappings.len() as u64
            }
        }
    }

    /// Adds a location; its id.
    pub fn location(&mut self, l: Location) -> u64 {
        self.locations.push(l);
        self.locations.len() as u64
    }

    /// The profile as `profile.proto` encodes it (not compressed).
    pub fn encode(&self) -> Vec<u8> {
        let mut strings = Strings::default();
        let mut out = Vec::new();
        for t in &self.sample_types {
            let mut m = Vec::new();
            field_varint(&mut m, 1, strings.index(&t.kind));
            field_varint(&mut m, 2, strings.index(&t.unit));
            field_bytes(&mut out, 1, &m);
        }
        for s in &self.samples {
            let mut m = Vec::new();
            field_packed(&mut m, 1, s.locations.iter().copied());
            field_packed(&mut m, 2, s.values.iter().map(|&v| v as u64));
            for (key, value) in &s.labels {
                let mut l = Vec::new();
                field_varint(&mut l, 1, strings.index(key));
                field_varint(&mut l, 2, strings.index(value));
                field_bytes(&mut m, 3, &l);
            }
            field_bytes(&mut out, 2, &m);
        }
        for (i, mp) in self.mappings.iter().enumerate() {
            let mut m = Vec::new();
            field_varint(&mut m, 1, i as u64 + 1);
            field_varint(&mut m, 2, mp.start);
            field_varint(&mut m, 3, mp.limit);
            field_varint(&mut m, 4, mp.offset);
            field_varint(&mut m, 5, strings.index(&mp.file));
            field_varint(&mut m, 6, strings.index(&mp.build_id));
            field_varint(&mut m, 7, mp.has_functions.into());
            field_varint(&mut m, 8, mp.has_filenames.into());
            field_varint(&mut m, 9, mp.has_line_numbers.into());
            field_bytes(&mut out, 3, &m);
        }
        for (i, loc) in self.locations.iter().enumerate() {
            let mut m = Vec::new();
            field_varint(&mut m, 1, i as u64 + 1);
            field_varint(&mut m, 2, loc.mapping);
            field_varint(&mut m, 3, loc.address);
            for line in &loc.lines {
                let mut l = Vec::new();
                field_varint(&mut l, 1, line.function);
                field_varint(&mut l, 2, line.line as u64);
                field_bytes(&mut m, 4, &l);
            }
            field_bytes(&mut out, 4, &m);
        }
        for (i, f) in self.functions.iter().enumerate() {
            let mut m = Vec::new();
            field_varint(&mut m, 1, i as u64 + 1);
            field_varint(&mut m, 2, strings.index(&f.name));
            field_varint(&mut m, 3, strings.index(&f.name));
            field_varint(&mut m, 4, strings.index(&f.file));
            field_bytes(&mut out, 5, &m);
        }
        for s in &strings.list {
            field_bytes(&mut out, 6, s.as_bytes());
        }
        field_varint(&mut out, 9, self.time_nanos as u64);
        field_varint(&mut out, 10, self.duration_nanos as u64);
        out
    }
}

/// The string table: `""` at index 0, each string once.
#[derive(Debug)]
pub struct Strings {
    list: Vec<String>,
    index: std::collections::HashMap<String, u64>,
}

impl Default for Strings {
    fn default() -> Self {
        Strings { list: vec![String::new()], index: [(String::new(), 0)].into_iter().collect() }
    }
}

impl Strings {
    /// The index of `s`, added if new.
    pub fn index(&mut self, s: &str) -> u64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.list.len() as u64;
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// Appends `v` as a base-128 varint, low groups first.
pub fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends field `field` as a varint (wire type 0); a 0 is left out, as proto3 does.
pub fn field_varint(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        varint(out, u64::from(field) << 3);
        varint(out, v);
    }
}

/// Appends field `field` as length-delimited bytes (wire type 2).
pub fn field_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, (u64::from(field) << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Appends repeated varints as one packed field (left out when there are none).
pub fn field_packed(out: &mut Vec<u8>, field: u32, values: impl Iterator<Item = u64>) {
    let mut packed = Vec::new();
    for v in values {
        varint(&mut packed, v);
    }
    if !packed.is_empty() {
        field_bytes(out, field, &packed);
    }
}

/// What the decoder refuses, and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Bad {
    /// The bytes end inside a field.
    #[error("cut short")]
    Short,
    /// A varint longer than 10 bytes, or a wire type the profile does not use.
    #[error("malformed field {0}")]
    Malformed(u64),
    /// A string index past the table, or an id out of order or pointing nowhere.
    #[error("bad reference in {0}")]
    Reference(&'static str),
}

/// A decoded field's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 2.
    Bytes(&'a [u8]),
}

/// Reads a varint at the start of `b`: its value and the bytes left.
pub fn read_varint(b: &[u8]) -> Result<(u64, &[u8]), Bad> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((v, &b[i + 1..]));
        }
    }
    Err(if b.len() < 10 { Bad::Short } else { Bad::Malformed(0) })
}

/// The fields of one message, in order: (field number, value).
pub fn fields(mut b: &[u8]) -> Result<Vec<(u64, Value<'_>)>, Bad> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let (tag, rest) = read_varint(b)?;
        let (field, wire) = (tag >> 3, tag & 7);
        match wire {
            0 => {
                let (v, rest) = read_varint(rest)?;
                out.push((field, Value::Varint(v)));
                b = rest;
            }
            2 => {
                let (len, rest) = read_varint(rest)?;
                let len = usize::try_from(len).ok().filter(|&l| l <= rest.len()).ok_or(Bad::Short)?;
                out.push((field, Value::Bytes(&rest[..len])));
                b = &rest[len..];
            }
            _ => return Err(Bad::Malformed(field)),
        }
    }
    Ok(out)
}

/// The varints of a packed field (or of one unpacked value).
fn unpacked(v: Value) -> Result<Vec<u64>, Bad> {
    match v {
        Value::Varint(n) => Ok(vec![n]),
        Value::Bytes(mut b) => {
            let mut out = Vec::new();
            while !b.is_empty() {
                let (n, rest) = read_varint(b)?;
                out.push(n);
                b = rest;
            }
            Ok(out)
        }
    }
}

fn num(v: Value, field: u64) -> Result<u64, Bad> {
    match v {
        Value::Varint(n) => Ok(n),
        Value::Bytes(_) => Err(Bad::Malformed(field)),
    }
}

fn bytes<'a>(v: Value<'a>, field: u64) -> Result<&'a [u8], Bad> {
    match v {
        Value::Bytes(b) => Ok(b),
        Value::Varint(_) => Err(Bad::Malformed(field)),
    }
}

/// Decodes a profile as [`Profile::encode`] writes it (not compressed): ids in order from 1,
/// every reference to a string, mapping, location or function in range.
pub fn decode(b: &[u8]) -> Result<Profile, Bad> {
    let top = fields(b)?;
    let mut strings: Vec<String> = Vec::new();
    for (f, v) in &top {
        if *f == 6 {
            strings.push(String::from_utf8_lossy(bytes(*v, 6)?).into_owned());
        }
    }
    if strings.first().is_some_and(|s| !s.is_empty()) {
        return Err(Bad::Reference("string_table"));
    }
    let s = |i: u64, what| strings.get(i as usize).cloned().ok_or(Bad::Reference(what));
    let mut p = Profile::default();
    for (f, v) in &top {
        let (f, v) = (*f, *v);
        match f {
            1 => {
                let mut t = ValueType::default();
                for (g, w) in fields(bytes(v, f)?)? {
                    match g {
                        1 => t.kind = s(num(w, g)?, "sample_type")?,
                        2 => t.unit = s(num(w, g)?, "sample_type")?,
                        _ => {}
                    }
                }
                p.sample_types.push(t);
            }
            2 => {
                let mut sample = Sample::default();
                for (g, w) in fields(bytes(v, f)?)? {
                    match g {
                        1 => sample.locations.extend(unpacked(w)?),
                        2 => sample.values.extend(unpacked(w)?.into_iter().map(|n| n as i64)),
                        3 => {
                            let (mut key, mut value) = (String::new(), String::new());
                            for (h, x) in fields(bytes(w, g)?)? {
                                match h {
                                    1 => key = s(num(x, h)?, "label")?,
                                    2 => value = s(num(x, h)?, "label")?,
                                    _ => {}
                                }
                            }
                            sample.labels.push((key, value));
                        }
                        _ => {}
                    }
                }
                p.samples.push(sample);
            }
            3 => {
                let mut m = Mapping::default();
                let mut id = 0;
                for (g, w) in fields(bytes(v, f)?)? {
                    match g {
                        1 => id = num(w, g)?,
                        2 => m.start = num(w, g)?,
                        3 => m.limit = num(w, g)?,
                        4 => m.offset = num(w, g)?,
                        5 => m.file = s(num(w, g)?, "mapping")?,
                        6 => m.build_id = s(num(w, g)?, "mapping")?,
                        7 => m.has_functions = num(w, g)? != 0,
                        8 => m.has_filenames = num(w, g)? != 0,
                        9 => m.has_line_numbers = num(w, g)? != 0,
                        _ => {}
                    }
                }
                if id != p.mappings.len() as u64 + 1 {
                    return Err(Bad::Reference("mapping id"));
                }
                p.mappings.push(m);
            }
            4 => {
                let mut l = Location::default();
                let mut id = 0;
                for (g, w) in fields(bytes(v, f)?)? {
                    match g {
                        1 => id = num(w, g)?,
                        2 => l.mapping = num(w, g)?,
                        3 => l.address = num(w, g)?,
                        4 => {
                            let mut line = Line::default();
                            for (h, x) in fields(bytes(w, g)?)? {
                                match h {
                                    1 => line.function = num(x, h)?,
                                    2 => line.line = num(x, h)? as i64,
                                    _ => {}
                                }
                            }
                            l.lines.push(line);
                        }
                        _ => {}
                    }
                }
                if id != p.locations.len() as u64 + 1 {
                    return Err(Bad::Reference("location id"));
                }
                p.locations.push(l);
            }
            5 => {
                let mut func = Function::default();
                let mut id = 0;
                for (g, w) in fields(bytes(v, f)?)? {
                    match g {
                        1 => id = num(w, g)?,
                        2 => func.name = s(num(w, g)?, "function")?,
                        4 => func.file = s(num(w, g)?, "function")?,
                        _ => {}
                    }
                }
                if id != p.functions.len() as u64 + 1 {
                    return Err(Bad::Reference("function id"));
                }
                p.functions.push(func);
            }
            9 => p.time_nanos = num(v, f)? as i64,
            10 => p.duration_nanos = num(v, f)? as i64,
            _ => {}
        }
    }
    let (mappings, locations, functions) =
        (p.mappings.len() as u64, p.locations.len() as u64, p.functions.len() as u64);
    let lines_ok = p
        .locations
        .iter()
        .all(|l| l.mapping <= mappings && l.lines.iter().all(|line| line.function >= 1 && line.function <= functions));
    let samples_ok = p
        .samples
        .iter()
        .all(|s| s.values.len() == p.sample_types.len() && s.locations.iter().all(|&id| id >= 1 && id <= locations));
    match (lines_ok, samples_ok) {
        (true, true) => Ok(p),
        (false, _) => Err(Bad::Reference("location")),
        (_, false) => Err(Bad::Reference("sample")),
    }
}

impl Profile {
    /// Sample `i`'s stack as function names, innermost first (a location's innermost line
    /// names it; `?` where a location has no line): for tests and checks.
    pub fn stack(&self, i: usize) -> Vec<&str> {
        let Some(s) = self.samples.get(i) else { return Vec::new() };
        s.locations
            .iter()
            .map(|&id| {
                let at = |id: u64| (id as usize).checked_sub(1);
                let line = at(id).and_then(|i| self.locations.get(i)).and_then(|l| l.lines.first());
                line.and_then(|l| at(l.function).and_then(|i| self.functions.get(i))).map_or("?", |f| f.name.as_str())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_base_128_low_groups_first() {
        let enc = |v| {
            let mut out = Vec::new();
            varint(&mut out, v);
            out
        };
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(1), [1]);
        assert_eq!(enc(127), [0x7f]);
        assert_eq!(enc(128), [0x80, 0x01]);
        assert_eq!(enc(300), [0xac, 0x02]);
        assert_eq!(enc(u64::MAX), [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        for v in [0, 1, 127, 128, 300, 1 << 35, u64::MAX] {
            assert_eq!(read_varint(&enc(v)), Ok((v, &[][..])));
        }
        assert_eq!(read_varint(&[0x80]), Err(Bad::Short));
        assert_eq!(read_varint(&[0xff; 11]), Err(Bad::Malformed(0)));
    }

    #[test]
    fn fields_carry_their_number_and_wire_type() {
        let mut out = Vec::new();
        field_varint(&mut out, 1, 150);
        assert_eq!(out, [0x08, 0x96, 0x01]);
        out.clear();
        field_varint(&mut out, 3, 0);
        assert!(out.is_empty(), "a zero is left out");
        field_bytes(&mut out, 2, b"testing");
        assert_eq!(out, b"\x12\x07testing");
        out.clear();
        field_packed(&mut out, 4, [3, 270, 86942].into_iter());
        assert_eq!(out, [0x22, 0x06, 0x03, 0x8e, 0x02, 0x9e, 0xa7, 0x05]);
        assert_eq!(fields(&out), Ok(vec![(4, Value::Bytes(&[0x03, 0x8e, 0x02, 0x9e, 0xa7, 0x05]))]));
        assert_eq!(unpacked(fields(&out).unwrap()[0].1), Ok(vec![3, 270, 86942]));
    }

    #[test]
    fn the_string_table_starts_with_the_empty_string() {
        let mut s = Strings::default();
        assert_eq!(s.index(""), 0);
        assert_eq!(s.index("main"), 1);
        assert_eq!(s.index("leaf"), 2);
        assert_eq!(s.index("main"), 1);
        assert_eq!(s.list, ["", "main", "leaf"]);
    }

    fn sample_profile() -> Profile {
        let mut p = Profile {
            sample_types: vec![ValueType { kind: "hits".into(), unit: "count".into() }],
            time_nanos: 1_700_000_000_000_000_000,
            duration_nanos: 5,
            ..Profile::default()
        };
        let m = p.mapping(Mapping {
            start: 0x5555_0000_0000,
            limit: 0x5555_0000_2000,
            offset: 0x1000,
            file: "/bin/prog".into(),
            build_id: "abcd".into(),
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
        });
        let leaf = p.function("leaf", "/src/prog.c");
        let main = p.function("main", "/src/prog.c");
        assert_eq!(p.function("leaf", "/src/prog.c"), leaf);
        let l1 = p.location(Location {
            mapping: m,
            address: 0x5555_0000_1040,
            lines: vec![Line { function: leaf, line: 25 }],
        });
        let l2 = p.location(Location {
            mapping: m,
            address: 0x5555_0000_1100,
            lines: vec![Line { function: main, line: 0 }],
        });
        p.samples.push(Sample { locations: vec![l1, l2], values: vec![3], labels: vec![("tid".into(), "12".into())] });
        p.samples.push(Sample { locations: vec![l2], values: vec![5], labels: Vec::new() });
        p
    }

    #[test]
    fn a_profile_decodes_to_what_was_encoded() {
        let p = sample_profile();
        let bytes = p.encode();
        assert_eq!(decode(&bytes), Ok(p.clone()));
        assert_eq!(p.stack(0), ["leaf", "main"]);
        assert_eq!(p.stack(1), ["main"]);
    }

    #[test]
    fn junk_is_refused_without_panic() {
        let bytes = sample_profile().encode();
        // Every cut: refused or read as a shorter profile, never a panic.
        for n in 0..bytes.len() {
            let _ = decode(&bytes[..n]);
        }
        // Every byte changed.
        for i in 0..bytes.len() {
            for x in [0x00, 0x7f, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] = x;
                let _ = decode(&b);
            }
        }
        assert_eq!(decode(&[0x0d, 0, 0, 0, 0]), Err(Bad::Malformed(1)), "a fixed32 field");
        assert_eq!(decode(&[0x12, 0x05, 0x08]), Err(Bad::Short));
        // A sample pointing at a location that is not there.
        let mut p = sample_profile();
        p.samples[0].locations.push(9);
        assert_eq!(decode(&p.encode()), Err(Bad::Reference("sample")));
        let mut out = Vec::new();
        field_bytes(&mut out, 1, &[0x08, 0x05]);
        assert_eq!(decode(&out), Err(Bad::Reference("sample_type")));
    }
}
