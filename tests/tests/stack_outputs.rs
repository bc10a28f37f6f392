//! Stacks as profiles people already read: `--format folded` (stackcollapse's lines) and
//! `--flamegraph FILE.svg`, on the fixture of `stacks.rs` (`-O2 -fomit-frame-pointer`, known
//! call chains), with exact counts.

use std::path::PathBuf;

use uprobe_tests::{gcc, run_uprobe, tempfile, Run};

const FLAGS: &[&str] = &["-O2", "-g", "-fomit-frame-pointer", "-Wall", "-Wextra", "-pthread", "-ldl"];

fn stacks() -> PathBuf {
    gcc("stacks", &["fixtures/stacks.c", "fixtures/stacks_corrupt.S"], FLAGS)
}

fn leaf(p: &std::path::Path) -> String {
    format!("p:leaf {}:leaf", p.display())
}

/// The folded lines of a run: (frames, outermost first; count).
fn folded(run: &Run) -> Vec<(Vec<String>, u64)> {
    run.output
        .lines()
        .map(|l| {
            let (stack, n) = l.rsplit_once(' ').unwrap_or_else(|| panic!("not a folded line: {l:?}"));
            (stack.split(';').map(str::to_string).collect(), n.parse().unwrap_or_else(|_| panic!("{l:?}")))
        })
        .collect()
}

/// The frames from `main` on.
fn from_main(stack: &[String]) -> Vec<&str> {
    let main = stack.iter().position(|f| f == "main").unwrap_or_else(|| panic!("no main in {stack:?}"));
    stack[main..].iter().map(String::as_str).collect()
}

#[test]
fn folded_lines_give_each_stack_outermost_first_with_its_exact_count() {
    let p = stacks();
    let run = run_uprobe(&[
        "-e",
        &leaf(&p),
        "--count",
        "--by",
        "ustack",
        "--format",
        "folded",
        p.to_str().unwrap(),
        "chain",
        "3",
        "5",
    ]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    assert_eq!(run.stdout, "done\n");
    let lines = folded(&run);
    assert_eq!(lines.len(), 2, "{}", run.output);
    // Most hits first; every line from the program's _start to the probed leaf.
    for ((stack, n), (path, count)) in lines.iter().zip([("path_b", 5), ("path_a", 3)]) {
        assert_eq!(*n, count, "{}", run.output);
        assert_eq!(stack[0], "_start", "{}", run.output);
        assert_eq!(from_main(stack), ["main", path, "f1", "f2", "f3", "f4", "f5", "f6", "leaf"]);
    }

    // Other key parts come first, as the outermost frames; the depth cuts from the leaf.
    let run = run_uprobe(&[
        "-e",
        &leaf(&p),
        "--count",
        "--by",
        "tid,ustack:3",
        "--format",
        "folded",
        p.to_str().unwrap(),
        "chain",
        "2",
        "4",
    ]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    let lines = folded(&run);
    assert_eq!(lines.len(), 1, "{}", run.output);
    let (stack, n) = &lines[0];
    assert_eq!(*n, 6);
    assert!(stack[0].parse::<u32>().is_ok(), "a thread id first: {stack:?}");
    assert_eq!(&stack[1..], ["f5", "f6", "leaf"]);
}

#[test]
fn a_flamegraph_is_drawn_with_every_frame_named() {
    let p = stacks();
    let svg = tempfile("flame").with_extension("svg");
    let run = run_uprobe(&[
        "-e",
        &leaf(&p),
        "--count",
        "--by",
        "ustack",
        "--flamegraph",
        svg.to_str().unwrap(),
        p.to_str().unwrap(),
        "chain",
        "3",
        "5",
    ]);
    assert!(run.status.success(), "{}{}", run.stderr, run.output);
    // The text report as without it.
    assert!(run.output.contains("count leaf by ustack: 8 hits, 2 keys\n"), "{}", run.output);
    let text = std::fs::read_to_string(&svg).unwrap_or_else(|e| panic!("{}: {e}\n{}", svg.display(), run.stderr));
    let _ = std::fs::remove_file(&svg);
    assert!(text.starts_with("<?xml") && text.trim_end().ends_with("</svg>"), "{text}");
    // Each frame is a box titled `NAME (N hits, P%)`, as flamegraph.pl titles them.
    // The two paths part at main: the chain's frames are drawn once on each.
    for (frame, hits) in [("_start", 8), ("main", 8), ("path_a", 3), ("path_b", 5)] {
        assert_eq!(text.matches(&format!("<title>{frame} (")).count(), 1, "{frame}");
        assert!(text.contains(&format!("<title>{frame} ({hits} hits, ")), "{frame} ({hits} hits) not drawn");
    }
    for frame in ["f1", "f2", "f3", "f4", "f5", "f6", "leaf"] {
        for hits in [3, 5] {
            assert!(text.contains(&format!("<title>{frame} ({hits} hits, ")), "{frame} ({hits} hits) not drawn");
        }
        assert_eq!(text.matches(&format!("<title>{frame} (")).count(), 2, "{frame}");
    }
}

#[test]
fn folded_stacks_and_flamegraphs_need_a_stack_key() {
    let p = stacks();
    let def = leaf(&p);
    let svg = tempfile("flame").with_extension("svg");
    let cases: [(&[&str], &str); 5] = [
        (&["--count", "--format", "folded"], "--format folded: folds the stacks of --count --by ustack"),
        (&["--count", "--by", "tid", "--format", "folded"], "--format folded: folds the stacks of --count --by ustack"),
        (&["--format", "folded"], "--format folded: folds the stacks of --count --by ustack"),
        (
            &["--count", "--by", "ustack", "--hist", "leaf.x", "--format", "folded"],
            "--format folded: histograms and timed calls have no stacks to fold",
        ),
        (&["--count", "--flamegraph", svg.to_str().unwrap()], "--flamegraph: draws the stacks of --count --by ustack"),
    ];
    for (args, line) in cases {
        let mut all = vec!["-e", def.as_str()];
        all.extend_from_slice(args);
        all.extend([p.to_str().unwrap(), "chain", "1", "0"]);
        let run = run_uprobe(&all);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "the program did not start");
        assert_eq!(run.stderr, format!("uprobe-run: {line}\n"), "{args:?}");
    }
    assert!(!svg.exists());
}
