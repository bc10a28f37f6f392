//! The messages an attach session's agent (in the target process) and the `uprobe-run` that
//! attached exchange over their unix socket: one message per seqpacket, text, fields
//! separated by tabs, ending with a NUL (which no message carries elsewhere). Both sides
//! encode and decode with this module, so they always agree.
//!
//! Decoding is exact: a message decodes only if it is what `encode` writes for the value it
//! decodes to (no other spelling of a number, no missing or extra field), so a message cut
//! short (it lacks its NUL) or with a field changed out of shape is refused, never read as
//! another. The other side is not trusted: decoding never panics.

/// The longest message either side sends.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// The first byte of a message on a session's output socket that carries a part of a file
/// `uprobe-run` writes at the end of the session (`--flamegraph`, `--pprof`): then the
/// file's kind ([`FOLDED`], [`PPROF`]), then its next bytes. The process cannot write these
/// files itself: it would write them as its own user, in its own file system.
pub const FILE_PART: u8 = 2;
/// The folded stacks (`frame;frame count` lines) `uprobe-run` draws the flame graph from.
pub const FOLDED: u8 = b'f';
/// The profile (`profile.proto`, not compressed) `uprobe-run` checks, gzips and writes.
pub const PPROF: u8 = b'p';

/// The messages of a hold (see the runtime's `attach::hold`), which the agent sends and reads
/// without allocating: one of the held threads may hold the runtime's allocator lock.
pub const STOP: &str = "stop\0";
/// See [`STOP`].
pub const RESTOP: &str = "restop\0";
/// See [`STOP`].
pub const RESUME: &str = "resume\0";
/// See [`STOP`].
pub const RESUMED: &str = "resumed\0";
const STOPPED: &str = "stopped\t";

/// Reads a `stopped` answer into `rips`, within its capacity, without allocating: Some(true)
/// when every address fit, Some(false) when some did not, None when it is not a well-formed
/// `stopped` answer (the threads were not stopped).
pub fn parse_stopped(text: &[u8], rips: &mut Vec<usize>) -> Option<bool> {
    let list = text.strip_prefix(STOPPED.as_bytes())?.strip_suffix(b"\0")?;
    rips.clear();
    if list.is_empty() {
        return Some(true);
    }
    let mut fits = true;
    for item in list.split(|&b| b == b',') {
        let value = hex(item)?;
        if rips.len() == rips.capacity() {
            fits = false;
        } else {
            rips.push(value);
        }
    }
    Some(fits)
}

/// A number as `{:x}` writes it: lowercase hex digits, no leading zero.
fn hex(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() || (digits[0] == b'0' && digits.len() > 1) {
        return None;
    }
    let mut value: usize = 0;
    for &b in digits {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        value = value.checked_mul(16)?.checked_add(usize::from(digit))?;
    }
    Some(value)
}

/// A number as `{}` writes it: decimal digits, no sign, no leading zero.
fn decimal<T: core::str::FromStr>(text: &str) -> Option<T> {
    let canonical =
        !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) && (text == "0" || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

/// From the agent to `uprobe-run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FromAgent {
    /// First message: who the agent is, and whether the runtime was preloaded when the process
    /// started (started by `uprobe-run`) rather than loaded by this attach.
    Hello {
        /// The process, as its own PID namespace numbers it.
        pid: i32,
        /// The agent thread, as its own PID namespace numbers it.
        tid: i32,
        /// Whether the runtime was preloaded at the process's start.
        preloaded: bool,
    },
    /// Stop every thread but the agent (a batch is about to be written).
    Stop,
    /// Let the stopped threads run briefly and stop them again.
    Restop,
    /// Let the stopped threads run again.
    Resume,
    /// The handler libraries are loaded, their `uprobe_init` returned 0, the probes are armed.
    Ready {
        /// Handler libraries loaded.
        libraries: usize,
        /// Probes armed.
        probes: usize,
        /// How many of them are jumps (the rest are `int3`).
        jumps: usize,
    },
    /// A handler library failed to load or its `uprobe_init` failed: what it registered is
    /// removed; `line` says why. The agent then ends as after a detach.
    Failed {
        /// Why, in one line.
        line: String,
    },
    /// What the session asks cannot be done in this process (a definition that does not
    /// resolve, an option that does not apply): `line` names it; nothing of it stays. The
    /// agent then ends as after a detach.
    Refused {
        /// What, in one line.
        line: String,
    },
    /// The listing the session asked for is written; the agent ends.
    Listed {
        /// Functions listed (lines).
        functions: usize,
    },
    /// The session's handler libraries ran `uprobe_exit`, their probes are removed: the agent
    /// ends. `notes`: what the user should know (libraries left loaded, and why).
    Detached {
        /// Probes removed.
        probes: usize,
        /// What the user should know, a line each.
        notes: Vec<String>,
    },
    /// The process is exiting: the libraries' `uprobe_exit` ran; nothing more will come.
    Exiting,
}

/// From `uprobe-run` to the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToAgent {
    /// The session: handler libraries, parameters and options as `UPROBE_RUN_SPEC` records
    /// (see [`crate::spec`]); the message carries the output's descriptor.
    Spec(String),
    /// Before the spec, with `--serve`: the message carries the metrics feed's descriptor
    /// (the spec's aggregations answer on it, as a launch's `feed` record says).
    Feed,
    /// Every other thread is stopped; where each resumes (see `probe::world::World::stop`).
    Stopped(Vec<usize>),
    /// The threads could not be stopped (the reason is for the record).
    Unstoppable(String),
    /// The threads run again.
    Resumed,
    /// End the session.
    Detach,
}

/// The message's verb and fields, once its NUL is found at its end and nowhere else.
fn fields(text: &str) -> Option<(&str, Vec<&str>)> {
    let text = text.strip_suffix('\0').filter(|t| !t.contains('\0'))?;
    let mut parts = text.split('\t');
    let verb = parts.next().unwrap_or("");
    Some((verb, parts.collect()))
}

/// Free text as one field: no tab, no newline, no NUL.
fn one_line(text: &str) -> String {
    text.replace(['\t', '\n', '\0'], " ")
}

impl FromAgent {
    /// The message as it goes on the socket.
    pub fn encode(&self) -> String {
        let mut text = match self {
            FromAgent::Hello { pid, tid, preloaded } => format!("hello\t{pid}\t{tid}\t{}", u8::from(*preloaded)),
            FromAgent::Stop => STOP.into(),
            FromAgent::Restop => RESTOP.into(),
            FromAgent::Resume => RESUME.into(),
            FromAgent::Ready { libraries, probes, jumps } => format!("ready\t{libraries}\t{probes}\t{jumps}"),
            FromAgent::Failed { line } => format!("failed\t{}", one_line(line)),
            FromAgent::Refused { line } => format!("refused\t{}", one_line(line)),
            FromAgent::Listed { functions } => format!("listed\t{functions}"),
            FromAgent::Detached { probes, notes } => {
                let mut text = format!("detached\t{probes}");
                for note in notes {
                    text.push('\t');
                    text.push_str(&one_line(note));
                }
                text
            }
            FromAgent::Exiting => "exiting\0".into(),
        };
        if !text.ends_with('\0') {
            text.push('\0');
        }
        text
    }

    /// The message `text` is, or None if it is not exactly one.
    pub fn decode(text: &str) -> Option<FromAgent> {
        let (verb, f) = fields(text)?;
        let num = |i: usize| f.get(i).and_then(|v| decimal::<usize>(v));
        let preloaded = |v: &str| match v {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        };
        Some(match (verb, f.len()) {
            ("hello", 3) => FromAgent::Hello {
                pid: decimal(f[0]).filter(|&p: &i32| p > 0)?,
                tid: decimal(f[1]).filter(|&t: &i32| t > 0)?,
                preloaded: preloaded(f[2])?,
            },
            ("stop", 0) => FromAgent::Stop,
            ("restop", 0) => FromAgent::Restop,
            ("resume", 0) => FromAgent::Resume,
            ("ready", 3) => FromAgent::Ready { libraries: num(0)?, probes: num(1)?, jumps: num(2)? },
            _ if f.iter().any(|field| field.contains('\n')) => return None,
            ("failed", 1) => FromAgent::Failed { line: f[0].into() },
            ("refused", 1) => FromAgent::Refused { line: f[0].into() },
            ("listed", 1) => FromAgent::Listed { functions: num(0)? },
            ("detached", n) if n >= 1 => {
                FromAgent::Detached { probes: num(0)?, notes: f[1..].iter().map(|s| s.to_string()).collect() }
            }
            ("exiting", 0) => FromAgent::Exiting,
            _ => return None,
        })
    }
}

impl ToAgent {
    /// The message as it goes on the socket.
    pub fn encode(&self) -> String {
        let mut text = match self {
            ToAgent::Spec(records) => format!("spec\n{}", records.replace('\0', " ")),
            ToAgent::Stopped(rips) => {
                let rips: Vec<String> = rips.iter().map(|r| format!("{r:x}")).collect();
                format!("{STOPPED}{}", rips.join(","))
            }
            ToAgent::Unstoppable(why) => format!("unstoppable\t{}", one_line(why)),
            ToAgent::Resumed => RESUMED.into(),
            ToAgent::Detach => "detach\0".into(),
            ToAgent::Feed => "feed\0".into(),
        };
        if !text.ends_with('\0') {
            text.push('\0');
        }
        text
    }

    /// The message `text` is, or None if it is not exactly one.
    pub fn decode(text: &str) -> Option<ToAgent> {
        if let Some(records) = text.strip_prefix("spec\n") {
            let records = records.strip_suffix('\0').filter(|r| !r.contains('\0'))?;
            return Some(ToAgent::Spec(records.into()));
        }
        let (verb, f) = fields(text)?;
        Some(match (verb, f.len()) {
            ("stopped", 1) if f[0].is_empty() => ToAgent::Stopped(Vec::new()),
            ("stopped", 1) => ToAgent::Stopped(f[0].split(',').map(|r| hex(r.as_bytes())).collect::<Option<_>>()?),
            ("unstoppable", 1) if !f[0].contains('\n') => ToAgent::Unstoppable(f[0].into()),
            ("resumed", 0) => ToAgent::Resumed,
            ("detach", 0) => ToAgent::Detach,
            ("feed", 0) => ToAgent::Feed,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    mod generated;

    #[test]
    fn every_message_survives_the_trip() {
        let from = [
            FromAgent::Hello { pid: 12, tid: 13, preloaded: true },
            FromAgent::Stop,
            FromAgent::Restop,
            FromAgent::Resume,
            FromAgent::Ready { libraries: 2, probes: 2126, jumps: 2034 },
            FromAgent::Failed { line: "/h.so: uprobe_init() failed, returned -22".into() },
            FromAgent::Refused { line: "-e 'p nosuch': no function".into() },
            FromAgent::Listed { functions: 2583 },
            FromAgent::Detached { probes: 3, notes: vec!["/h.so stays loaded".into()] },
            FromAgent::Detached { probes: 0, notes: vec![] },
            FromAgent::Exiting,
        ];
        for m in from {
            assert_eq!(FromAgent::decode(&m.encode()), Some(m));
        }
        let to = [
            ToAgent::Spec("handlers\t/h.so\nparam\tvaddr=0x401126".into()),
            ToAgent::Stopped(vec![0x401126, 0x7f00_0000_1234]),
            ToAgent::Stopped(vec![]),
            ToAgent::Unstoppable("thread 7 is traced by 99".into()),
            ToAgent::Resumed,
            ToAgent::Detach,
            ToAgent::Feed,
        ];
        for m in to {
            assert_eq!(ToAgent::decode(&m.encode()), Some(m));
        }
    }

    #[test]
    fn stopped_answers_parse_within_the_room_given() {
        let text = ToAgent::Stopped(vec![0x401126, 0x7f00_0000_1234]).encode();
        let mut rips = Vec::with_capacity(2);
        assert_eq!(parse_stopped(text.as_bytes(), &mut rips), Some(true));
        assert_eq!(rips, [0x401126, 0x7f00_0000_1234]);
        let mut small = Vec::with_capacity(1);
        assert_eq!(parse_stopped(text.as_bytes(), &mut small), Some(false));
        assert_eq!(small.capacity(), 1, "no allocation");
        assert_eq!(parse_stopped(b"stopped\t\0", &mut rips), Some(true));
        assert!(rips.is_empty());
        assert_eq!(parse_stopped(b"unstoppable\tno\0", &mut rips), None);
        assert_eq!(parse_stopped(b"stopped\tx1\0", &mut rips), None);
    }

    #[test]
    fn messages_stay_one_record_and_junk_is_refused() {
        let m = FromAgent::Failed { line: "a\tb\nc".into() };
        assert_eq!(m.encode(), "failed\ta b c\0");
        assert_eq!(FromAgent::decode("ready\t1\t2\0"), None);
        assert_eq!(FromAgent::decode("hello\tx\t1\t0\0"), None);
        assert_eq!(ToAgent::decode("stopped\tzz\0"), None);
        assert_eq!(ToAgent::decode("nonsense\0"), None);
        // Spellings `encode` never writes.
        for junk in ["ready\t1\t2\t03\0", "ready\t1\t2\t+3\0", "hello\t1\t2\t2\0", "hello\t-1\t2\t1\0", "resume\0\0"] {
            assert_eq!(FromAgent::decode(junk), None, "{junk:?}");
        }
        for junk in ["stopped\tA\0", "stopped\t,1\0", "stopped\t1,\0", "stopped\t01\0", "detach", "spec\nx"] {
            assert_eq!(ToAgent::decode(junk), None, "{junk:?}");
        }
    }
}
