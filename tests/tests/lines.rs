//! Source lines as probe places: `p PROG:FUNC:N` and `p FILE.c:N` hit exactly as often as the
//! line runs in `fixtures/lines.c` (built `-g -O2`, with a function inlined twice), at the
//! addresses `perf probe` chooses, with the counts the kernel's uprobes see through perf on
//! the same program; `-L` prints what `perf probe -L` prints; a line without code, a
//! function or file that does not exist, a line that shares its address with another and a
//! program without DWARF are refused in one line, exit status 2, before the program starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use uprobe_tests::{gcc, nm_address, run_plain, run_uprobe, tracefs, uprobe_run, Run};

fn lines() -> PathBuf {
    gcc("lines", &["fixtures/lines.c"], &["-O2", "-g", "-Wall", "-Wextra"])
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The places probed, with how often each line runs for N = 10 (see the fixture's comment).
fn places(prog: &Path) -> Vec<(String, u64)> {
    let p = s(prog);
    vec![
        (format!("{p}:classify:4"), 4),   // r = twice(n);      (line 22)
        (format!("{p}:classify:6"), 3),   // sink = 1;          (line 24)
        (format!("{p}:classify:10"), 3),  // r = -n;            (line 28)
        (format!("{p}:classify:13"), 10), // return r;         (line 31: three returns)
        (format!("{p}:loop:4"), 10),      // total += twice(i); (line 38)
        ("lines.c:15".to_string(), 14),   // return x * 2;      (twice, inlined into classify and loop)
        (format!("{p}:lines.c:49"), 1),   // printf             (main)
    ]
}

/// Per event: its records' sites (`FUNC+0xOFF`) and how many records each has.
fn sites(run: &Run) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for l in run.output.lines() {
        let Some((head, rest)) = l.split_once(": (") else { continue };
        let event = head.rsplit(' ').next().unwrap().to_string();
        let site = rest.split(')').next().unwrap().to_string();
        *out.entry(event).or_default().entry(site).or_default() += 1;
    }
    out
}

/// `FUNC+0xOFF` as a link-time address.
fn address(prog: &Path, site: &str) -> u64 {
    let (func, off) = site.split_once("+0x").unwrap_or((site, "0"));
    nm_address(prog, func) + u64::from_str_radix(off, 16).unwrap()
}

/// A place, its hits, and the hits at each of its addresses.
type Found = (String, u64, BTreeMap<u64, u64>);

/// Every line probed at once: each place's hits sum to how often its line runs, one event
/// per site (`NAME`, `NAME_1`, ...), named after the function or the file and the line.
fn run_all(prog: &Path) -> (Run, Vec<Found>) {
    let places = places(prog);
    let defs: Vec<String> = places.iter().map(|(p, _)| format!("p {p}")).collect();
    let mut args: Vec<&str> = defs.iter().flat_map(|d| ["-e", d.as_str()]).collect();
    args.push(s(prog));
    let run = run_uprobe(&args);
    assert_eq!(run.status.code(), Some(0), "{}\n{}", run.stderr, run.output);
    assert_eq!(run.stdout, "sum=144\n");
    let by_event = sites(&run);
    let mut out = Vec::new();
    for (place, _) in &places {
        let tail = place.rsplit('/').next().unwrap();
        let mut parts: Vec<&str> = tail.split(':').collect();
        let line = parts.pop().unwrap();
        let name = parts.pop().unwrap().split('.').next().unwrap();
        let base = format!("{name}_L{line}");
        let mut at: BTreeMap<u64, u64> = BTreeMap::new();
        for (event, hits) in &by_event {
            let ours =
                event == &base || event.strip_prefix(&format!("{base}_")).is_some_and(|n| n.parse::<u32>().is_ok());
            if ours {
                for (site, n) in hits {
                    *at.entry(address(prog, site)).or_default() += n;
                }
            }
        }
        out.push((place.clone(), at.values().sum(), at));
    }
    (run, out)
}

#[test]
fn lines_of_functions_and_files_hit_as_often_as_they_run() {
    let prog = lines();
    assert_eq!(String::from_utf8_lossy(&run_plain(&prog, &[]).stdout), "sum=144\n");
    let (run, found) = run_all(&prog);
    for ((place, hits, at), (_, expected)) in found.iter().zip(places(&prog)) {
        assert_eq!(*hits, expected, "{place}: {at:x?}\n{}", run.output);
    }
    // Lines with several addresses: twice()'s return in both callers, classify's 3 returns.
    let sites_of = |p: &str| found.iter().find(|(place, ..)| place.ends_with(p)).unwrap().2.len();
    assert_eq!((sites_of("lines.c:15"), sites_of("classify:13")), (2, 3), "{}", run.output);
}

/// The kernel's uprobes through `perf probe`, on the same program: the file offsets perf
/// places for each place, and the hits `perf stat` counts on them.
fn perf_sites(prog: &Path, place: &str, group: &str) -> Result<(Vec<u64>, u64), String> {
    let tail = place.split_once(':').filter(|(m, _)| m.starts_with('/')).map_or(place, |(_, t)| t);
    let add = Command::new("perf").args(["probe", "-q", "-x", s(prog), "-a", &format!("{group}:l={tail}")]).output();
    let add = add.map_err(|e| format!("perf: {e}"))?;
    if !add.status.success() {
        return Err(format!("perf probe {tail}: {}", String::from_utf8_lossy(&add.stderr).trim()));
    }
    let events = std::fs::read_to_string(tracefs()?.join("uprobe_events")).unwrap();
    let offsets: Vec<u64> = events
        .lines()
        .filter(|l| l.contains(&format!(":{group}/")))
        .filter_map(|l| u64::from_str_radix(l.rsplit(":0x").next()?.split_whitespace().next()?, 16).ok())
        .collect();
    let stat = Command::new("perf").args(["stat", "-x,", "-e", &format!("{group}:*"), s(prog)]).output().unwrap();
    let _ = Command::new("perf").args(["probe", "-q", "-d", &format!("{group}:*")]).output();
    let hits =
        String::from_utf8_lossy(&stat.stderr).lines().filter_map(|l| l.split(',').next()?.parse::<u64>().ok()).sum();
    Ok((offsets, hits))
}

#[test]
fn the_addresses_and_counts_are_those_of_perf_probe_on_the_kernels_uprobes() {
    let skip = |why: &str| eprintln!("skipped: {why}");
    if Command::new("perf").arg("--version").output().is_err() {
        return skip("no perf");
    }
    if let Err(why) = tracefs() {
        return skip(&why);
    }
    let prog = lines();
    let (run, found) = run_all(&prog);
    // The fixture is a PIE whose text is mapped at its file offset: offsets are addresses.
    let text = nm_address(&prog, "classify");
    for (i, (place, hits, at)) in found.iter().enumerate() {
        let group = format!("uprt_lines{}_{i}", std::process::id());
        let (offsets, perf_hits) = match perf_sites(&prog, place, &group) {
            Ok(r) => r,
            Err(why) => return skip(&why),
        };
        let ours: Vec<u64> = at.keys().copied().collect();
        assert_eq!(ours, offsets, "{place}: sites (classify at {text:#x})\n{}", run.output);
        assert_eq!(*hits, perf_hits, "{place}: hits");
    }
}

#[test]
fn dash_l_shows_the_lines_perf_probe_shows() {
    let prog = lines();
    let show = |range: &str| Command::new(uprobe_run()).args(["-L", range, s(&prog)]).output().unwrap();
    let classify = show("classify");
    assert_eq!(classify.status.code(), Some(0));
    let source = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lines.c")).unwrap();
    let src: Vec<&str> = source.lines().collect();
    // Lines 18..34; numbered (from classify's line 18) where a probe can go.
    let numbered = [0, 4, 5, 6, 7, 9, 10, 12, 13];
    let mut want =
        format!("<classify@{}:0>\n", Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lines.c").display());
    for l in 18..=34u32 {
        let text = src[l as usize - 1];
        match numbered.contains(&(l - 18)) {
            true => want += &format!("{:>7}  {text}\n", l - 18),
            false => want += &format!("         {text}\n"),
        }
    }
    assert_eq!(String::from_utf8_lossy(&classify.stdout), want);
    if Command::new("perf").arg("--version").output().is_err() {
        return eprintln!("skipped the comparison with perf probe -L: no perf");
    }
    for range in ["classify", "loop", "main", "classify:4-6", "lines.c:10-16", "lines.c:40"] {
        let perf = Command::new("perf").args(["probe", "-x", s(&prog), "-L", range]).output().unwrap();
        let mut perf_text = String::from_utf8_lossy(&perf.stdout).into_owned();
        // perf leaves the last line of an explicit range without its newline.
        if !perf_text.ends_with('\n') {
            perf_text.push('\n');
        }
        assert_eq!(String::from_utf8_lossy(&show(range).stdout), perf_text, "-L {range}");
    }
}

/// A refused definition: exit status 2, one line on stderr, the program not started.
fn refused(def: &str, prog: &Path) -> String {
    let run = run_uprobe(&["-e", def, s(prog)]);
    assert_eq!(run.status.code(), Some(2), "{def}: {}", run.stderr);
    assert_eq!(run.stdout, "", "{def}: the program ran");
    assert_eq!(run.stderr.lines().count(), 1, "{def}: {}", run.stderr);
    run.stderr
}

#[test]
fn bad_lines_functions_files_and_programs_without_dwarf_are_refused_naming_what_exists() {
    let prog = lines();
    let p = s(&prog);
    // Line 26 is `} else {`: no code of its own.
    let e = refused(&format!("p {p}:classify:8"), &prog);
    assert!(
        e.contains("classify:8 (line 26 of ")
            && e.contains("has no code (nearest lines with code: classify:7, classify:9)"),
        "{e}"
    );
    // Past classify's end (line 33 is blank, 34 is loop's first line): only classify's
    // own lines are offered, not loop's.
    let e = refused(&format!("p {p}:classify:15"), &prog);
    assert!(e.contains("has no code (nearest lines with code: classify:13)\n"), "{e}");
    // Line 20 (`int r;`) has a row, at classify's entry, which is line 18's.
    let e = refused(&format!("p {p}:classify:2"), &prog);
    assert!(e.contains("shares its address") && e.contains("probe classify:0 instead"), "{e}");
    let e = refused(&format!("p {p}:clasify:4"), &prog);
    assert!(e.contains("no function clasify in the DWARF of") && e.contains("(functions with code: classify, "), "{e}");
    let e = refused("p nosuch.c:3", &prog);
    assert!(e.contains("no source file nosuch.c in the DWARF of") && e.contains("lines.c"), "{e}");
    // Line 30's first address is also line 15's (inlined twice()): perf refuses it too.
    let e = refused("p lines.c:30", &prog);
    assert!(e.contains("shares its address") && e.contains("probe lines.c:15 instead"), "{e}");
    let e = refused(&format!("r {p}:classify:4"), &prog);
    assert!(e.contains("no return probe"), "{e}");
    let bare = gcc("lines_nodebug", &["fixtures/lines.c"], &["-O2", "-g0"]);
    let e = refused("p lines.c:22", &bare);
    assert!(e.contains("has no DWARF (not built with -g)"), "{e}");
    let missing = Command::new(uprobe_run()).args(["-L", "nosuch", s(&prog)]).output().unwrap();
    assert_eq!(missing.status.code(), Some(2));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("no function nosuch with code") && err.contains("classify"), "{err}");
}

/// `-L` on a program whose source is gone: one line saying so, with the lines' numbers.
#[test]
fn dash_l_without_the_source_says_so_in_one_line() {
    let dir = uprobe_tests::tempfile("lines-src");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("gone.c");
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lines.c"), &source).unwrap();
    let prog = dir.join("gone");
    let built = Command::new("gcc").args(["-O2", "-g", "-o"]).arg(&prog).arg(&source).output().unwrap();
    assert!(built.status.success(), "{built:?}");
    std::fs::remove_file(&source).unwrap();
    let out = Command::new(uprobe_run()).args(["-L", "classify", s(&prog)]).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("gone.c: cannot read the source")
            && err.ends_with("the lines a probe can go on: 0, 4, 5, 6, 7, 9, 10, 12, 13\n"),
        "{err}"
    );
}
