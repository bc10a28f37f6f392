//! The messages an attach session's agent (in the target process) and the `uprobe-run` that
//! attached exchange over their unix socket: one message per seqpacket, text, fields
//! separated by tabs. Pure: no system calls, no state, no imports from the runtime, because
//! `uprobe-run` compiles this very file too (so both sides always agree).

/// The longest message either side sends.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// The messages of a hold (see `hold`), which the agent sends and reads without allocating:
/// one of the held threads may hold the runtime's allocator lock.
pub const STOP: &str = "stop";
pub const RESTOP: &str = "restop";
pub const RESUME: &str = "resume";
pub const RESUMED: &str = "resumed";
const STOPPED: &str = "stopped\t";

/// Reads a `stopped` answer into `rips`, within its capacity, without allocating: Some(true)
/// when every address fit, Some(false) when some did not, None when it is not a well-formed
/// `stopped` answer (the threads were not stopped).
pub fn parse_stopped(text: &[u8], rips: &mut Vec<usize>) -> Option<bool> {
    let list = text.strip_prefix(STOPPED.as_bytes())?;
    rips.clear();
    for item in list.split(|&b| b == b',').filter(|i| !i.is_empty()) {
        let mut value: usize = 0;
        for &b in item {
            let digit = (b as char).to_digit(16)? as usize;
            value = value.checked_mul(16)?.checked_add(digit)?;
        }
        if rips.len() == rips.capacity() {
            return Some(false);
        }
        rips.push(value);
    }
    Some(true)
}

/// From the agent to `uprobe-run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FromAgent {
    /// First message: who the agent is, and whether the runtime was preloaded when the process
    /// started (started by `uprobe-run`) rather than loaded by this attach.
    Hello { pid: i32, tid: i32, preloaded: bool },
    /// Stop every thread but the agent (a batch is about to be written).
    Stop,
    /// Let the stopped threads run briefly and stop them again.
    Restop,
    /// Let the stopped threads run again.
    Resume,
    /// The handler libraries are loaded, their `uprobe_init` returned 0, the probes are armed.
    Ready { libraries: usize, probes: usize, jumps: usize },
    /// A handler library failed to load or its `uprobe_init` failed: what it registered is
    /// removed; `line` says why. The agent then ends as after a detach.
    Failed { line: String },
    /// What the session asks cannot be done in this process (a definition that does not
    /// resolve, an option that does not apply): `line` names it; nothing of it stays. The
    /// agent then ends as after a detach.
    Refused { line: String },
    /// The listing the session asked for is written (`functions` lines); the agent ends.
    Listed { functions: usize },
    /// The session's handler libraries ran `uprobe_exit`, their probes are removed: the agent
    /// ends. `notes`: what the user should know (libraries left loaded, and why).
    Detached { probes: usize, notes: Vec<String> },
    /// The process is exiting: the libraries' `uprobe_exit` ran; nothing more will come.
    Exiting,
}

/// From `uprobe-run` to the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToAgent {
    /// The session: handler libraries, parameters and options as `UPROBE_RUN_SPEC` records
    /// (see `base::spec`); the message carries the output's descriptor.
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

fn fields(text: &str) -> (&str, Vec<&str>) {
    let mut parts = text.split('\t');
    let verb = parts.next().unwrap_or("");
    (verb, parts.collect())
}

fn one_line(text: &str) -> String {
    text.replace(['\t', '\n'], " ")
}

impl FromAgent {
    pub fn encode(&self) -> String {
        match self {
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
            FromAgent::Exiting => "exiting".into(),
        }
    }

    pub fn decode(text: &str) -> Option<FromAgent> {
        let (verb, f) = fields(text);
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<usize>().ok());
        Some(match (verb, f.len()) {
            ("hello", 3) => {
                FromAgent::Hello { pid: f[0].parse().ok()?, tid: f[1].parse().ok()?, preloaded: f[2] == "1" }
            }
            ("stop", 0) => FromAgent::Stop,
            ("restop", 0) => FromAgent::Restop,
            ("resume", 0) => FromAgent::Resume,
            ("ready", 3) => FromAgent::Ready { libraries: num(0)?, probes: num(1)?, jumps: num(2)? },
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
    pub fn encode(&self) -> String {
        match self {
            ToAgent::Spec(records) => format!("spec\n{records}"),
            ToAgent::Stopped(rips) => {
                let rips: Vec<String> = rips.iter().map(|r| format!("{r:x}")).collect();
                format!("{STOPPED}{}", rips.join(","))
            }
            ToAgent::Unstoppable(why) => format!("unstoppable\t{}", one_line(why)),
            ToAgent::Resumed => RESUMED.into(),
            ToAgent::Detach => "detach".into(),
            ToAgent::Feed => "feed".into(),
        }
    }

    pub fn decode(text: &str) -> Option<ToAgent> {
        if let Some(records) = text.strip_prefix("spec\n") {
            return Some(ToAgent::Spec(records.into()));
        }
        let (verb, f) = fields(text);
        Some(match (verb, f.len()) {
            ("stopped", 1) => ToAgent::Stopped(
                f[0].split(',')
                    .filter(|s| !s.is_empty())
                    .map(|r| usize::from_str_radix(r, 16).ok())
                    .collect::<Option<_>>()?,
            ),
            ("unstoppable", 1) => ToAgent::Unstoppable(f[0].into()),
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
        assert_eq!(parse_stopped(b"stopped\t", &mut rips), Some(true));
        assert!(rips.is_empty());
        assert_eq!(parse_stopped(b"unstoppable\tno", &mut rips), None);
        assert_eq!(parse_stopped(b"stopped\tx1", &mut rips), None);
    }

    #[test]
    fn messages_stay_one_record_and_junk_is_refused() {
        let m = FromAgent::Failed { line: "a\tb\nc".into() };
        assert_eq!(m.encode(), "failed\ta b c");
        assert_eq!(FromAgent::decode("ready\t1\t2"), None);
        assert_eq!(FromAgent::decode("hello\tx\t1\t0"), None);
        assert_eq!(ToAgent::decode("stopped\tzz"), None);
        assert_eq!(ToAgent::decode("nonsense"), None);
    }
}
