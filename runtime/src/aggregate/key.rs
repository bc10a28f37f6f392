//! What a counted hit is counted by (`--by`): the parts of a key and the words each takes.
//! Pure data, read by the plan (`plan`) and the hit path (`hit`).

/// The longest string kept as a key (longer ones are cut, as bpftrace's `str()` cuts them).
pub const STRING_KEY: usize = 64;

/// One part of what a hit of a counted event is counted by (`--by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// A number fetcharg, a string one (kept up to [`STRING_KEY`] bytes): index into args.
    Arg(usize),
    String(usize),
    /// The thread (`tid`), and the thread shown (and merged) by its name (`comm`).
    Tid,
    Comm,
    /// The return address: where the function was called from.
    Caller,
    Ustack(usize), // the user stack's id (`stacks`), of at most this many frames
    /// A timed function's argument at its entry: the Nth register of the calling convention
    /// (0: %rdi, %rsi, %rdx, %rcx, %r8, %r9), shown as `--by arg{N+1}`.
    Reg(u8),
}

impl Key {
    /// The words the part takes in a key.
    pub fn words(self) -> usize {
        match self {
            Key::String(_) => STRING_KEY / 8,
            Key::Arg(_) | Key::Tid | Key::Comm | Key::Caller | Key::Ustack(_) | Key::Reg(_) => 1,
        }
    }

    /// A stack part's depth.
    pub fn depth(self) -> Option<usize> {
        match self {
            Key::Ustack(d) => Some(d),
            _ => None,
        }
    }
}

/// A key's part and where its words start in the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyPart {
    pub key: Key,
    pub at: usize,
}
