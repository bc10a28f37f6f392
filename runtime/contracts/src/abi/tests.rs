//! The types of `abi` against `include/uprobe.h` as the C compiler lays it out: a small C
//! program, compiled at test time, prints the size and alignment of every struct and the
//! offset and size of every field the Rust side names; both lists must be equal, and the
//! fields must cover each struct but for alignment padding (a field of the header missing on
//! the Rust side shows as a gap).

use super::*;
use core::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A field's offset, size and alignment.
type Field = (usize, usize, usize);

fn size_of_field<T, F>(_: fn(&T) -> &F) -> (usize, usize) {
    (size_of::<F>(), align_of::<F>())
}

/// The layout as lines: `struct NAME size align` or `field STRUCT.FIELD offset size`, and the
/// C statements that print the same lines for the header's types.
struct Layout {
    lines: Vec<String>,
    c_body: String,
    /// Per struct: its name, its size, and its fields in declaration order.
    structs: Vec<(&'static str, usize, Vec<Field>)>,
}

macro_rules! layout {
    ($($rust:ty => $c:literal { $($field:ident),* $(,)? $(; flexible $flex:ident)? })*) => {{
        let mut l = Layout { lines: Vec::new(), c_body: String::new(), structs: Vec::new() };
        $(
            l.lines.push(format!("struct {} {} {}", $c, size_of::<$rust>(), align_of::<$rust>()));
            l.c_body.push_str(&format!(
                "  printf(\"struct %s %zu %zu\\n\", \"{c}\", sizeof(struct {c}), _Alignof(struct {c}));\n",
                c = $c
            ));
            let mut fields = Vec::new();
            $(
                let (size, align) = size_of_field(|s: &$rust| &s.$field);
                let offset = offset_of!($rust, $field);
                fields.push((offset, size, align));
                l.lines.push(format!("field {}.{} {} {}", $c, stringify!($field), offset, size));
                l.c_body.push_str(&format!(
                    "  printf(\"field %s %zu %zu\\n\", \"{c}.{f}\", offsetof(struct {c}, {f}), \
                     sizeof(((struct {c} *)0)->{f}));\n",
                    c = $c,
                    f = stringify!($field)
                ));
            )*
            $(
                // `char data[]`: no size in C; zero-sized on the Rust side.
                let (size, align) = size_of_field(|s: &$rust| &s.$flex);
                let offset = offset_of!($rust, $flex);
                fields.push((offset, size, align));
                l.lines.push(format!("field {}.{} {} {}", $c, stringify!($flex), offset, size));
                l.c_body.push_str(&format!(
                    "  printf(\"field %s %zu 0\\n\", \"{c}.{f}\", offsetof(struct {c}, {f}));\n",
                    c = $c,
                    f = stringify!($flex)
                ));
            )?
            l.structs.push(($c, size_of::<$rust>(), fields));
        )*
        l
    }};
}

fn layout() -> Layout {
    layout! {
        PtRegs => "pt_regs" {
            r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8,
            rax, rcx, rdx, rsi, rdi, orig_rax, rip, cs, eflags, rsp, ss,
        }
        Uprobe => "uprobe" { pid, vaddr, handler, registration_callback, symbol_name, offset, reserved }
        Uretprobe => "uretprobe" { u, handler, entry_handler, data_size, maxactive, nmissed }
        UretprobeInstance => "uretprobe_instance" { rp, ret_addr, reserved; flexible data }
    }
}

fn header_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../include")
}

/// What the C compiler says, or None (and why) when no C compiler is installed.
fn c_layout(body: &str) -> Option<Vec<String>> {
    let dir = std::env::temp_dir().join(format!("uprobe-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("layout.c");
    let program = dir.join("layout");
    let text = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"uprobe.h\"\n\
         int main(void) {{\n{body}  printf(\"const UPTY_UPROBE %d\\nconst UPTY_URETPROBE %d\\n\", \
         (int)UPTY_UPROBE, (int)UPTY_URETPROBE);\n  return 0;\n}}\n"
    );
    std::fs::write(&source, text).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = match Command::new(&cc)
        .arg("-std=c11")
        .arg("-I")
        .arg(header_dir())
        .arg(&source)
        .arg("-o")
        .arg(&program)
        .status()
    {
        Ok(status) => status,
        Err(e) => {
            eprintln!("skipped: no C compiler ({cc}: {e}) to check the ABI against uprobe.h");
            return None;
        }
    };
    assert!(built.success(), "{cc} could not compile the layout program against uprobe.h");
    let out = Command::new(&program).output().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.status.success());
    Some(String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect())
}

#[test]
fn every_size_and_offset_matches_the_c_header() {
    let mut layout = layout();
    let Some(c) = c_layout(&layout.c_body) else { return };
    layout.lines.push(format!("const UPTY_UPROBE {UPTY_UPROBE}"));
    layout.lines.push(format!("const UPTY_URETPROBE {UPTY_URETPROBE}"));
    assert_eq!(layout.lines, c);
}

#[test]
fn the_fields_named_cover_each_struct() {
    for (name, size, fields) in layout().structs {
        let mut end = 0;
        for (offset, field_size, align) in fields {
            assert!(offset >= end && offset - end < align, "struct {name}: a gap before offset {offset}");
            end = offset + field_size;
        }
        assert!(size - end < 8, "struct {name}: {} bytes after its last field", size - end);
    }
}

#[test]
fn pid_t_is_the_c_library_s() {
    assert_eq!(size_of::<pid_t>(), size_of::<libc::pid_t>());
    assert_eq!(pid_t::MIN, libc::pid_t::MIN);
}

#[test]
fn arguments_follow_sysv_order() {
    let regs = PtRegs { rdi: 1, rsi: 2, rdx: 3, rcx: 4, r8: 5, r9: 6, rax: 7, ..PtRegs::default() };
    let args: Vec<_> = (0..7).map(|n| regs.arg(n)).collect();
    assert_eq!(args, [Some(1), Some(2), Some(3), Some(4), Some(5), Some(6), None]);
    assert_eq!(regs.return_value(), 7);
}
