//! The code of the hit paths: which hits save the vector registers (the runtime's own hit path
//! and aggregation code use none, read from the built libuprobe.so; a jump probe whose
//! handlers declare `UPROBE_NO_VECTORS` skips their save, every other probe keeps it), and how
//! the return trampoline leaves.

use std::collections::{BTreeMap, BTreeSet};

use iced_x86::{Decoder, DecoderOptions, FlowControl, Formatter, IntelFormatter, OpKind};
use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, SymbolKind};
use uprobe_tests::*;

/// Where a walk of the hit path stops, and why it may:
/// - `uprobe_vector_safe` saves the vector registers around the code it calls (which it gets
///   by pointer, so the walk does not follow it anyway);
/// - `core::panicking`: a bounds check that fails aborts the process (`panic = "abort"`).
const STOPS: [&str; 2] = ["uprobe_vector_safe", "4core9panicking"];

/// Functions of other objects the walk may meet, and why:
/// - `__errno_location`: called only before start-up measured errno's place (no probe exists
///   then); afterwards errno is found from the thread pointer.
const OUTSIDE: [&str; 1] = ["__errno_location"];

/// What the pointer slots of libuprobe.so (its GOT) hold once loaded: an address of its own,
/// or the name of another object's symbol.
fn slots(obj: &object::File) -> BTreeMap<u64, Result<u64, String>> {
    let names = obj.dynamic_symbol_table();
    let mut slots = BTreeMap::new();
    for (at, r) in obj.dynamic_relocations().into_iter().flatten() {
        let held = match r.target() {
            object::RelocationTarget::Symbol(i) => Err(names
                .as_ref()
                .and_then(|t| t.symbol_by_index(i).ok())
                .and_then(|s| s.name().ok().map(str::to_string))
                .unwrap_or_default()),
            _ => Ok(r.addend() as u64),
        };
        slots.insert(at, held);
    }
    slots
}

/// The text section of libuprobe.so (its address and bytes) and its functions by address.
fn functions(data: &[u8]) -> (u64, &[u8], BTreeMap<u64, (String, u64)>) {
    let obj = object::File::parse(data).unwrap();
    let text = obj.section_by_name(".text").unwrap();
    let mut functions = BTreeMap::new();
    for s in obj.symbols() {
        if s.kind() == SymbolKind::Text && s.size() > 0 {
            functions.insert(s.address(), (s.name().unwrap_or("").to_string(), s.size()));
        }
    }
    (text.address(), text.data().unwrap(), functions)
}

/// Every function of libuprobe.so reachable from `start` (part of a mangled name) by direct
/// calls and jumps (and those through its pointer slots), but for [`STOPS`]: returns the
/// problems found (vector registers, calls that leave the library's own code, e.g. through
/// the PLT to `__tls_get_addr`, but for [`OUTSIDE`]).
fn walk(data: &[u8], start: &str) -> (usize, Vec<String>) {
    let (base, code, functions) = functions(data);
    let slots = slots(&object::File::parse(data).unwrap());
    let first = functions
        .iter()
        .find(|(_, (name, _))| name.contains(start))
        .map(|(&at, _)| at)
        .unwrap_or_else(|| panic!("no function {start} in libuprobe.so"));
    let (mut todo, mut seen, mut problems) = (vec![first], BTreeSet::new(), Vec::new());
    let mut formatter = IntelFormatter::new();
    while let Some(at) = todo.pop() {
        if !seen.insert(at) {
            continue;
        }
        let (name, size) = &functions[&at];
        if STOPS.iter().any(|s| name.contains(s)) {
            continue;
        }
        let bytes = &code[(at - base) as usize..(at - base + size) as usize];
        for insn in Decoder::with_ip(64, bytes, at, DecoderOptions::NONE) {
            let vector = (0..insn.op_count()).any(|i| {
                insn.op_kind(i) == OpKind::Register && {
                    let r = insn.op_register(i);
                    r.is_xmm() || r.is_ymm() || r.is_zmm()
                }
            });
            let mut text = String::new();
            formatter.format(&insn, &mut text);
            if vector {
                problems.push(format!("{name}+{:#x}: {text}", insn.ip() - at));
            }
            let direct = matches!(
                insn.flow_control(),
                FlowControl::Call | FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
            ) && insn.op0_kind() == OpKind::NearBranch64;
            let through_slot = matches!(insn.flow_control(), FlowControl::IndirectCall | FlowControl::IndirectBranch)
                && insn.is_ip_rel_memory_operand();
            if through_slot {
                match slots.get(&insn.ip_rel_memory_address()) {
                    Some(Ok(target)) if functions.contains_key(target) => todo.push(*target),
                    Some(Err(symbol)) if OUTSIDE.contains(&symbol.as_str()) => {}
                    other => problems.push(format!("{name}+{:#x}: {text} (calls {other:?})", insn.ip() - at)),
                }
            }
            if direct {
                let target = insn.near_branch_target();
                if (at..at + size).contains(&target) {
                    continue;
                }
                if functions.contains_key(&target) {
                    todo.push(target);
                } else {
                    problems.push(format!("{name}+{:#x}: {text} (leaves the runtime's code)", insn.ip() - at));
                }
            }
        }
    }
    (seen.len(), problems)
}

#[test]
fn the_hit_paths_and_the_runtimes_own_handlers_touch_no_vector_register() {
    ensure_built();
    let data = std::fs::read(artefact("libuprobe.so")).unwrap();
    // The Rust side of a jump hit (return probes' entries included), the trampoline's
    // choice and the Rust side of a return, and the handlers of every counted entry and
    // return event, of `--latency`'s timed calls (their quick entry and return too) and of
    // the trace stream's records.
    for start in [
        "5probe8dispatch8jump_hit17h",
        "5probe8retprobe14return_vectors17h",
        "5probe8retprobe10return_hit17h",
        "9aggregate3hit8on_entry17h",
        "9aggregate3hit9on_return17h",
        "9aggregate3hit13latency_entry17h",
        "9aggregate3hit14latency_return17h",
        "9aggregate5timed11timed_entry17h",
        "9aggregate5timed12timed_return17h",
        "5trace6record8on_entry17h",
        "5trace5quick9event_hit17h",
        "5trace6record9on_return17h",
    ] {
        let (functions, problems) = walk(&data, start);
        assert!(functions > 1, "{start}: {functions} functions");
        assert!(problems.is_empty(), "{start} reaches:\n{}", problems.join("\n"));
    }
}

fn jump_probe() -> std::path::PathBuf {
    gcc("jump_probe", &["fixtures/jump_probe.c", "fixtures/jump_asm.S"], &["-O2", "-g"])
}

fn regcheck(params: &[&str]) -> String {
    let prog = jump_probe();
    let handler = test_handler("xmm_clobber");
    let mut args = vec!["--handlers", handler.to_str().unwrap()];
    for p in params {
        args.extend(["--param", p]);
    }
    args.push(prog.to_str().unwrap());
    let run = run_uprobe(&args);
    assert!(run.status.success(), "{}", run.stderr);
    run.stdout.lines().filter(|l| l.starts_with("regcheck")).collect::<Vec<_>>().join("\n")
}

#[test]
fn a_probe_declared_vector_free_skips_the_save_and_others_keep_it() {
    let ok = "regcheck: ok\nregcheck: ok\nregcheck: ok";
    // By default the handler's xmm3 never reaches the program.
    assert_eq!(regcheck(&[]), ok);
    // Declared free of vectors, the handler's write reaches it (xmm3 is register 16 + 3) on
    // the jump path, which saved nothing; the trap path restores everything the kernel saved.
    let skipped = if int3_only() { ok.to_string() } else { ["regcheck: register 19 changed"; 3].join("\n") };
    assert_eq!(regcheck(&["novec=1"]), skipped);
    // One probe at the place that does not declare it and computes with a double: the point
    // saves them for both.
    assert_eq!(regcheck(&["novec=1", "mixed=fp"]), ok);
    // One that does not declare it but only counts: its code is read at registration and
    // found free of vector instructions, so the point still skips the save.
    assert_eq!(regcheck(&["novec=1", "mixed=1"]), skipped);
}

#[test]
fn a_return_handler_that_needs_the_vectors_has_them_saved_beside_vector_free_ones() {
    let ok = "regcheck: ok\nregcheck: ok\nregcheck: ok";
    // The return handler overwrites xmm3 without declaring anything: its returns save them.
    assert_eq!(regcheck(&["ret=1"]), ok);
    // Declared free (a broken promise): no registered return probe needs them, and the
    // trampoline saves nothing.
    assert_eq!(regcheck(&["ret=novec"]), ["regcheck: register 19 changed"; 3].join("\n"));
    // Beside --latency's vector-free return probe on the same function, whose record is the
    // newest: the return still saves them for the handler that needs them.
    let prog = jump_probe();
    let handler = test_handler("xmm_clobber");
    let site = format!("{}:regcheck_site", prog.display());
    for order in [
        ["--latency", &site, "--handlers", handler.to_str().unwrap()],
        ["--handlers", handler.to_str().unwrap(), "--latency", &site],
    ] {
        let mut args = order.to_vec();
        args.extend(["--param", "ret=1", prog.to_str().unwrap()]);
        let run = run_uprobe(&args);
        assert!(run.status.success(), "{}", run.stderr);
        assert!(run.stdout.starts_with(&format!("{ok}\n")), "{args:?}: {}", run.stdout);
        assert!(run.output.contains("regcheck_site"), "{}", run.output);
    }
}

#[test]
fn a_handler_whose_code_uses_no_vector_register_skips_the_save_undeclared() {
    // --verbose says what the reading of each undeclared handler found.
    let prog = jump_probe();
    let handler = test_handler("xmm_clobber");
    let verbose = |mixed: &str| {
        let args = ["--verbose", "--handlers", handler.to_str().unwrap(), "--param", mixed, prog.to_str().unwrap()];
        let run = run_uprobe(&args);
        assert!(run.status.success(), "{}", run.stderr);
        let said = |l: &&str| l.starts_with("uprobe-run: handler ");
        (
            run.stdout.lines().filter(|l| l.starts_with("regcheck")).count(),
            run.output.lines().filter(said).map(String::from).collect::<Vec<_>>(),
        )
    };
    let (checks, said) = verbose("mixed=1");
    assert_eq!(checks, 3);
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(said[0].starts_with("uprobe-run: handler on_hit") && said[0].contains("(`pcmpeqd` at 0x"), "{said:?}");
    assert!(said[0].ends_with("): its hits save them"), "{said:?}");
    assert!(said[1].starts_with("uprobe-run: handler on_plain_hit"), "{said:?}");
    assert!(said[1].ends_with(" touches no vector register: its hits skip their save"), "{said:?}");
    let (_, said) = verbose("mixed=fp");
    assert!(
        said[1].starts_with("uprobe-run: handler on_fp_hit") && said[1].ends_with("its hits save them"),
        "{said:?}"
    );
}

#[test]
fn counting_keeps_every_register_without_saving_the_vectors() {
    // --count's handler is declared vector-free: the program's xmm0-15 (and the rest) pass.
    let prog = jump_probe();
    let place = format!("p:regcheck_site {}:regcheck_site", prog.display());
    let run = run_uprobe(&["--count", "-e", &place, prog.to_str().unwrap()]);
    assert!(run.status.success(), "{}", run.stderr);
    assert!(run.stdout.starts_with("regcheck: ok\nregcheck: ok\nregcheck: ok\n"), "{}", run.stdout);
    assert!(run.output.lines().any(|l| l.split_whitespace().eq(["regcheck_site", "3"])), "{}", run.output);
}

#[test]
fn the_return_trampoline_leaves_by_an_indirect_jump_but_after_a_call_through() {
    // A `ret` there would pop the return-stack buffer a second time for a return hooked by
    // writing the trampoline's address. Calls made through `uprobe_call_through` (just
    // before the trampoline, whose address its call pushes) still have the caller's entry:
    // the quick way out (one `ret`) serves them only.
    ensure_built();
    let data = std::fs::read(artefact("libuprobe.so")).unwrap();
    let (base, code, functions) = functions(&data);
    let find = |want: &str| functions.iter().find(|(_, (name, _))| name == want).map(|(&at, (_, size))| (at, *size));
    let (at, size) = find("uprobe_ret_trampoline").unwrap();
    let bytes = &code[(at - base) as usize..(at - base + size) as usize];
    let insns: Vec<_> = Decoder::with_ip(64, bytes, at, DecoderOptions::NONE).into_iter().collect();
    assert_eq!(insns.iter().filter(|i| i.flow_control() == FlowControl::Return).count(), 1, "one ret");
    assert_eq!(insns.last().unwrap().flow_control(), FlowControl::IndirectBranch);
    let (through, len) = find("uprobe_call_through").unwrap();
    assert_eq!(through + len, at, "uprobe_call_through runs into the trampoline");
    let call = Decoder::with_ip(64, &code[(through - base) as usize..], through, DecoderOptions::NONE).decode();
    assert_eq!((call.flow_control(), call.len() as u64), (FlowControl::IndirectCall, len));
}

#[test]
fn timed_calls_and_recorded_events_keep_every_register_without_saving_the_vectors() {
    // --latency's return probe and the stream's record handlers are declared vector-free:
    // the entry hit and the return through the trampoline skip the vector save, and the
    // program's registers (xmm0-15 included) still hold their values after each call.
    let prog = jump_probe();
    let site = format!("{}:regcheck_site", prog.display());
    let ok = "regcheck: ok\nregcheck: ok\nregcheck: ok\n";
    let run = run_uprobe(&["--latency", &site, prog.to_str().unwrap()]);
    assert!(run.status.success(), "{}", run.stderr);
    assert!(run.stdout.starts_with(ok), "{}", run.stdout);
    assert!(run.output.contains("regcheck_site"), "{}", run.output);
    let entry = format!("p:rc/in {site} a=%di");
    let ret = format!("r:rc/out {site} $retval");
    let run = run_uprobe(&["-e", &entry, "-e", &ret, prog.to_str().unwrap()]);
    assert!(run.status.success(), "{}", run.stderr);
    assert!(run.stdout.starts_with(ok), "{}", run.stdout);
    let records = |name: &str| run.output.lines().filter(|l| l.contains(name)).count();
    assert_eq!((records("in:"), records("out:")), (3, 3), "{}", run.output);
}
