//! The quick paths of a stub. `--latency`: a timed function's jump goes to its stub's quick
//! entry, which goes to the runtime's quick code; that times the call without building a
//! register frame and calls the function so that its return into the trampoline is
//! predicted; the return is taken by the trampoline's quick path. Each scenario of the return
//! probes' hazards (recursion, tail calls, more pending calls than `maxactive`, longjmp, C++
//! exceptions through a shared library, backtrace(), pthread_exit, a signal handler in the
//! middle of a call, threads, fork) runs with the quick paths and again with `--no-optimize`
//! (every hit through `int3` and the common paths): the program's output is the unprobed
//! run's, and the numbers of every timed function (calls, entered, not returned and why) are
//! the same both ways and, where the fixture knows them, exact. Events of the stream: the
//! jump goes to a quick entry that calls the record code without the dispatcher, and every
//! call is recorded but those made inside a handler. With `UPROBE_TEST_NO_OPTIMIZE=1` every
//! run takes the common paths.

use std::path::Path;

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic};
use object::{Object, ObjectSymbol};
use serde_json::Value;
use uprobe_tests::*;

const C_FLAGS: &[&str] = &["-O2", "-g", "-fno-inline", "-pthread"];

/// What the end-of-run report says of each timed function: (calls, entered, not returned:
/// total, left by longjmp or an exception, still pending).
type Numbers = (u64, u64, u64, u64, u64);

/// Runs `program` with `args` under `--latency` of each of `functions` (the program's, or
/// places `PATH:FUNCTION`; `--no-optimize` too with `int3`), checks that it behaved as the unprobed run, and returns the numbers of each
/// function, in order.
fn timed(program: &Path, functions: &[&str], args: &[&str], int3: bool) -> (Run, Vec<Numbers>) {
    let plain = run_plain(program, args);
    let p = program.to_str().unwrap();
    let mut a = vec!["--format".to_string(), "json".into()];
    // The harness adds --no-optimize itself in int3 mode.
    if int3 && !int3_only() {
        a.push("--no-optimize".into());
    }
    for f in functions {
        let place = if f.contains(':') { f.to_string() } else { format!("{p}:{f}") };
        a.extend(["--latency".to_string(), place]);
    }
    a.push(p.into());
    a.extend(args.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let run = run_uprobe(&refs);
    assert_eq!(run.status.code(), plain.status.code(), "{a:?}: {}\n{}", run.stderr, run.output);
    assert_eq!(run.stdout, String::from_utf8_lossy(&plain.stdout), "{a:?}: stdout differs from the unprobed run");
    let objects: Vec<Value> = run
        .output
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    // Some of the functions take a jump (short ones may keep an `int3`): their calls go
    // through the quick paths, the others' through the common ones, on the same records.
    let jumps = functions.iter().filter(|f| {
        objects
            .iter()
            .any(|o| o["kind"] == "latency" && o["function"] == f.rsplit(':').next().unwrap() && o["probe"] == "jump")
    });
    assert!(int3 || int3_only() || jumps.count() > 0, "{}", run.output);
    let numbers = functions
        .iter()
        .map(|f| {
            let lat = objects
                .iter()
                .find(|o| o["kind"] == "latency" && o["function"] == f.rsplit(':').next().unwrap())
                .unwrap_or_else(|| panic!("no latency of {f} in {}", run.output));
            let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("{f}: {lat}"));
            let left = &lat["not_returned"];
            (n(&lat["count"]), n(&lat["entered"]), n(&left["total"]), n(&left["left"]), n(&left["pending"]))
        })
        .collect();
    (run, numbers)
}

/// [`timed`] with the quick paths and through `int3`: the numbers must agree; returns them.
fn both_ways(program: &Path, functions: &[&str], args: &[&str]) -> Vec<Numbers> {
    let (_, quick) = timed(program, functions, args, false);
    let (_, int3) = timed(program, functions, args, true);
    assert_eq!(quick, int3, "{functions:?}: quick paths, then int3");
    quick
}

fn returned(calls: u64) -> Numbers {
    (calls, calls, 0, 0, 0)
}

fn count_stub() -> std::path::PathBuf {
    fixture("count_stub", &["-O1", "-g", "-pthread", "-rdynamic", "-Wall", "-Wextra"])
}

/// The code the jump at count_stub's counted() goes to, as the fixture read it under
/// `options` (of counted(), its place ends them): its address, bytes and first seven
/// instructions, and where the runtime is loaded; None where counted() took an `int3`.
fn jump_target(options: &[&str]) -> Option<(u64, Vec<u8>, Vec<Instruction>, u64)> {
    let prog = count_stub();
    let p = prog.to_str().unwrap();
    let mut args = options.to_vec();
    args.extend([p, "stub"]);
    let r = run_uprobe(&args);
    assert!(r.status.success(), "{}", r.stderr);
    let (at, bytes) = code_dump(&r.stdout)?;
    let mut decoder = Decoder::with_ip(64, &bytes, at, DecoderOptions::NONE);
    let insns: Vec<Instruction> = (0..7).map(|_| decoder.decode()).collect();
    let base = (r.stdout.lines())
        .find_map(|l| l.strip_prefix("runtime "))
        .map(|b| u64::from_str_radix(b.trim_start_matches("0x"), 16).unwrap())
        .unwrap_or_else(|| panic!("no runtime base in {}", r.stdout));
    Some((at, bytes, insns, base))
}

/// Where the runtime's symbol `name` lies in libuprobe.so.
fn runtime_symbol(name: &str) -> u64 {
    let lib = std::fs::read(artefact("libuprobe.so")).unwrap();
    let file = object::File::parse(&*lib).unwrap();
    file.symbols().find(|s| s.name() == Ok(name)).unwrap_or_else(|| panic!("no {name}")).address()
}

/// The word the `insn` of a quick entry read from the fixture (`bytes`, from `at`) goes
/// through, as an offset in the runtime.
fn through(insn: &Instruction, at: u64, bytes: &[u8], base: u64) -> u64 {
    let word = (insn.ip_rel_memory_address() - at) as usize;
    u64::from_le_bytes(bytes[word..word + 8].try_into().unwrap()) - base
}

#[test]
fn the_jump_of_a_timed_function_goes_to_its_stubs_quick_entry() {
    let place = format!("{}:counted", count_stub().display());
    let Some((at, bytes, insns, base)) = jump_target(&["--latency", &place]) else {
        assert!(int3_only(), "a jump was expected at counted()");
        println!("SKIPPED: int3 mode (--no-optimize): no stub to read");
        return;
    };
    let mnemonics: Vec<Mnemonic> = insns.iter().map(|i| i.mnemonic()).collect();
    use Mnemonic::*;
    // The head's frame (the red zone stepped over, the point's word) and a jump through a
    // word of the stub, to the runtime's quick code.
    assert_eq!(mnemonics[..6], [Lea, Push, Mov, Mov, Pop, Jmp], "{insns:?}");
    assert_eq!(insns[5].flow_control(), FlowControl::IndirectBranch);
    assert_eq!(through(&insns[5], at, &bytes, base), runtime_symbol("uprobe_timed_entry"));

    // With another probe on the function, the jump goes to the stub's head, whose call is
    // followed by the relocated instructions: the common path.
    let entry = format!("p:t/counted {place}");
    let (_, _, insns, _) = jump_target(&["--latency", &place, "--count", "-e", &entry]).expect("a jump at counted()");
    assert_eq!(insns[5].flow_control(), FlowControl::IndirectCall, "{insns:?}");
    assert_ne!(insns[6].mnemonic(), Jmp, "{insns:?}");
}

#[test]
fn an_events_jump_goes_to_a_quick_entry_that_calls_the_record_code() {
    let event = format!("p:t/counted {}:counted v=%di", count_stub().display());
    let Some((at, bytes, insns, base)) = jump_target(&["-e", &event]) else {
        assert!(int3_only(), "a jump was expected at counted()");
        println!("SKIPPED: int3 mode (--no-optimize): no stub to read");
        return;
    };
    let mnemonics: Vec<Mnemonic> = insns.iter().map(|i| i.mnemonic()).collect();
    use Mnemonic::*;
    // The stub's head again, its call through another word, then a jump to the body.
    assert_eq!(mnemonics, [Lea, Push, Mov, Mov, Pop, Call, Jmp], "{insns:?}");
    assert_eq!(insns[5].flow_control(), FlowControl::IndirectCall);
    assert_eq!(through(&insns[5], at, &bytes, base), runtime_symbol("uprobe_event_entry"));
    assert!(insns[6].near_branch_target() < at, "the body lies before the entry: {insns:?}");
}

#[test]
fn every_call_is_recorded_but_those_made_inside_a_handler() {
    let prog = count_stub();
    let p = prog.to_str().unwrap();
    let event = format!("p:t/counted {p}:counted v=%di");
    let records = |r: &Run| r.output.lines().filter(|l| l.contains(" counted: (counted+0x0) v=")).count() as u64;
    let own = |r: &Run| -> u64 { r.stdout.trim().strip_prefix("counted ").unwrap().parse().unwrap() };
    // Four threads: each one's first record claims its ring (the quick code does as the
    // dispatcher would).
    let r = run_uprobe(&["--buffer-size", "64M", "-e", &event, p, "threads", "3000"]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!((own(&r), records(&r)), (1 + 4 * 3000 + 6, 1 + 4 * 3000 + 6));
    // A handler on outer() calls counted() too: those calls run on a busy thread, which the
    // quick code leaves to the dispatcher, which records nothing for them.
    let handler = test_handler("calls_counted");
    let r = run_uprobe(&["--handlers", handler.to_str().unwrap(), "-e", &event, p, "nested", "700"]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(own(&r), 700);
    assert!(r.output.contains("calls_counted: hits=700"), "{}", r.output);
    assert_eq!(records(&r), 700, "{}", r.output);
}

#[test]
fn recursion_tail_calls_and_more_pending_calls_than_maxactive() {
    let prog = fixture("recurse", C_FLAGS);
    let funcs = ["fib", "is_even", "is_odd", "tail_a", "tail_b", "chain"];
    let numbers = both_ways(&prog, &funcs, &[]);
    for (f, n) in funcs.iter().zip(&numbers).take(3) {
        assert!(n.0 > 0 && *n == returned(n.0), "{f}: {n:?}");
    }
    // tail_a ends in `jmp tail_b`: one return serves both records (the common paths').
    assert_eq!((numbers[3], numbers[4]), (returned(10), returned(10)));
    // chain(100) makes 101 calls; 64 may be pending per thread: the rest are not timed.
    assert_eq!(numbers[5], returned(64));
}

#[test]
fn calls_left_by_longjmp_and_exceptions() {
    let prog = fixture("jumps", C_FLAGS);
    let numbers = both_ways(&prog, &["level1", "level2", "leaf"], &[]);
    // level1 and level2 are left by longjmp each of the 10 rounds; leaf returns each time.
    assert_eq!(numbers, [(0, 10, 10, 10, 0), (0, 10, 10, 10, 0), returned(20)]);

    let prog = except_program();
    let lib = format!("{}:lib_check", fixtures_dir().join("libexcept_lib.so").display());
    let numbers = both_ways(&prog, &["outer", "middle", "catching", &lib], &[]);
    // 11 calls of outer/middle/lib_check, 3 of which throw; catching catches its own.
    let thrown = (8, 11, 3, 3, 0);
    assert_eq!(numbers, [thrown, thrown, returned(4), thrown]);
}

#[test]
fn backtrace_sees_the_real_callers_of_timed_calls() {
    let prog = fixture("bt", &["-O1", "-g", "-fno-inline", "-fno-optimize-sibling-calls", "-rdynamic"]);
    let (run, numbers) = timed(&prog, &["outer", "inner", "show"], &[], false);
    assert!(run.stdout.contains("  #1 inner+0x"), "{}", run.stdout);
    assert_eq!(numbers, [returned(2), returned(2), returned(2)]);
}

#[test]
fn pthread_exit_a_signal_handler_threads_and_fork() {
    let prog = fixture("thread_exit", C_FLAGS);
    // Thread 2 leaves through pthread_exit from inside inner, called by outer.
    let left = (3, 4, 1, 0, 0);
    assert_eq!(both_ways(&prog, &["outer", "inner"], &[]), [left, left]);

    let prog = fixture("sig_mid", C_FLAGS);
    assert_eq!(both_ways(&prog, &["slow", "helper"], &[]), [returned(5), returned(10)]);

    // Each thread's first call claims its block through the common path, then goes quick.
    let prog = count_stub();
    let (run, numbers) = timed(&prog, &["counted"], &["threads", "3000"], false);
    let own: u64 = run.stdout.trim().strip_prefix("counted ").unwrap().parse().unwrap();
    assert_eq!((own, numbers[0]), (1 + 4 * 3000 + 6, returned(own)));
    // A forked child's calls are timed with its parent's, through the records it inherited.
    let (run, numbers) = timed(&prog, &["counted"], &["fork", "2000"], false);
    let own: u64 = run.stdout.trim().strip_prefix("counted ").unwrap().parse().unwrap();
    assert_eq!((own, numbers[0]), (1 + 4 * 2000, returned(own)));
}
