//! Counts made in a jump probe's stub (`--count` of an event with no filter, key or
//! histogram): exact with threads (each thread's first hit claims its block through the
//! common path), with more threads than blocks, across fork, beside a histogram, for calls
//! made from inside a handler (which count nowhere), with the flags and the registers the
//! stub borrows kept; and the code the jump goes to, read from the running process, counts
//! with no call, no locked instruction and no instruction that changes the flags. With
//! `UPROBE_TEST_NO_OPTIMIZE=1` the same counts come through `int3`.

use std::path::PathBuf;

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, Register};
use uprobe_tests::{code_dump, fixture, int3_only, run_uprobe, test_handler, Run};

fn program() -> PathBuf {
    fixture("count_stub", &["-O1", "-g", "-pthread", "-rdynamic", "-Wall", "-Wextra"])
}

fn run(args: &[&str]) -> Run {
    let r = run_uprobe(args);
    assert!(r.status.success(), "{args:?}: {}\n{}\n{}", r.stderr, r.stdout, r.output);
    r
}

/// The count of `event` in a `--format json` report.
fn count_of(r: &Run, event: &str) -> u64 {
    r.output
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .find(|o| o["kind"] == "count" && o["event"] == event && o.get("key").is_none())
        .and_then(|o| o["count"].as_u64())
        .unwrap_or_else(|| panic!("no count of {event} in {}", r.output))
}

/// What the fixture says it called: "counted N".
fn own(r: &Run) -> u64 {
    r.stdout
        .lines()
        .find_map(|l| l.strip_prefix("counted "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no own count in {}", r.stdout))
}

fn count_run(mode: &[&str]) -> (u64, u64) {
    let p = program();
    let p = p.to_str().unwrap();
    let event = format!("p:cs/counted {p}:counted");
    let mut args = vec!["--count", "--format", "json", "-e", &event, p];
    args.extend_from_slice(mode);
    let r = run(&args);
    (own(&r), count_of(&r, "counted"))
}

#[test]
fn every_threads_calls_are_counted_first_hits_included() {
    let (own, counted) = count_run(&["threads", "2000"]);
    assert_eq!((own, counted), (1 + 4 * 2000 + 6, 1 + 4 * 2000 + 6));
}

#[test]
fn threads_beyond_the_blocks_are_counted_too() {
    // 300 threads alive at once, more than the 256 blocks: the last ones count through the
    // handler's shared total.
    let (own, counted) = count_run(&["many", "50", "300"]);
    assert_eq!((own, counted), (15_000, 15_000));
}

#[test]
fn a_forked_childs_calls_count_with_its_parents() {
    let (own, counted) = count_run(&["fork", "3000"]);
    assert_eq!((own, counted), (1 + 4 * 3000, 1 + 4 * 3000));
}

#[test]
fn calls_from_inside_a_handler_count_nowhere() {
    let p = program();
    let p = p.to_str().unwrap();
    let handler = test_handler("calls_counted");
    let event = format!("p:cs/counted {p}:counted");
    let r = run(&[
        "--handlers",
        handler.to_str().unwrap(),
        "--count",
        "--format",
        "json",
        "-e",
        &event,
        p,
        "nested",
        "700",
    ]);
    assert_eq!(own(&r), 700);
    assert!(r.output.contains("calls_counted: hits=700"), "{}", r.output);
    // The handler's 700 calls of counted() ran no handler, and were not counted in the stub.
    assert_eq!(count_of(&r, "counted"), 700);
    assert!(r.output.contains("(counted+0x0): 700 hits ran no handler"), "{}", r.output);
}

#[test]
fn a_count_beside_a_histogram_is_exact() {
    let p = program();
    let p = p.to_str().unwrap();
    let counted = format!("p:cs/counted {p}:counted");
    let outer = format!("p:cs/outer {p}:outer v=%di:s64");
    let r =
        run(&["--count", "--hist", "outer.v", "--format", "json", "-e", &counted, "-e", &outer, p, "nested", "900"]);
    assert_eq!((own(&r), count_of(&r, "counted"), count_of(&r, "outer")), (900, 900, 900));
}

#[test]
fn the_stub_keeps_the_flags_and_the_registers_it_borrows() {
    let p = program();
    let p = p.to_str().unwrap();
    let flags = format!("p:cs/flags_in {p}:flags_in");
    let rcx = format!("p:cs/rcx_in {p}:rcx_in");
    let r = run(&["--count", "--format", "json", "-e", &flags, "-e", &rcx, p, "regs", "1500"]);
    assert_eq!(r.stdout, "regs 1500\n");
    assert_eq!((count_of(&r, "flags_in"), count_of(&r, "rcx_in")), (1500, 1500));
}

/// The code at the jump's target, as the fixture read it from its own memory, with `--count`
/// of the event `counted` defined with `more` after its place: its address and instructions,
/// up to and including the second `jmp`; None where `counted` took an `int3`.
fn jump_target(more: &str) -> Option<(u64, Vec<Instruction>)> {
    let p = program();
    let p = p.to_str().unwrap();
    let event = format!("p:cs/counted {p}:counted{more}");
    let r = run(&["--count", "-e", &event, p, "stub"]);
    let (at, bytes) = code_dump(&r.stdout)?;
    let mut decoder = Decoder::with_ip(64, &bytes, at, DecoderOptions::NONE);
    let mut insns = Vec::new();
    while decoder.can_decode() && insns.iter().filter(|i: &&Instruction| i.mnemonic() == Mnemonic::Jmp).count() < 2 {
        insns.push(decoder.decode());
    }
    Some((at, insns))
}

#[test]
fn the_stub_counts_with_no_call_lock_or_flag_change() {
    let Some((at, insns)) = jump_target("") else {
        assert!(int3_only(), "a jump was expected at counted()");
        println!("SKIPPED: int3 mode (--no-optimize): no stub to read");
        return;
    };
    assert!(!int3_only());
    let text: Vec<String> = insns.iter().map(|i| format!("{:?}", i.mnemonic())).collect();
    for i in &insns {
        assert_eq!(i.rflags_modified(), 0, "{text:?}: {:?} changes flags", i.mnemonic());
        assert!(!i.has_lock_prefix(), "{text:?}");
        assert!(!matches!(i.flow_control(), FlowControl::Call | FlowControl::IndirectCall), "{text:?}");
        assert!(!matches!(i.mnemonic(), Mnemonic::Pushfq | Mnemonic::Popfq | Mnemonic::Xchg), "{text:?}");
    }
    // The thread's word, read through %fs, and one store: the counter.
    assert!(insns.iter().any(|i| i.segment_prefix() == Register::FS), "{text:?}");
    let stores = insns.iter().filter(|i| i.mnemonic() == Mnemonic::Mov && i.op0_kind() == iced_x86::OpKind::Memory);
    assert_eq!(stores.count(), 1, "{text:?}");
    // The way out when it cannot count goes back to the stub's head, which lies before it.
    let head = insns.last().unwrap().near_branch_target();
    assert!(head < at, "{text:?}");

    // A filtered count runs its filter: the jump goes to the head, which calls the common
    // path before its first jmp.
    let (_, insns) = jump_target(" v=%di:s64 if v > 5").expect("a jump at counted()");
    let first_jmp = insns.iter().position(|i| i.mnemonic() == Mnemonic::Jmp).unwrap();
    assert!(insns[..first_jmp].iter().any(|i| i.flow_control() == FlowControl::IndirectCall), "{insns:?}");
}
