//! The `option` records: each switch of [`Options`] by its name.

use super::{Options, SpecError};

/// An option's field in [`Options`].
type Field = fn(&mut Options) -> &mut bool;

impl Options {
    /// Each option's record name, with its field.
    pub(super) const ALL: [(&'static str, Field); 10] = [
        ("follow-exec", |o| &mut o.follow_exec),
        ("no-follow-fork", |o| &mut o.no_follow_fork),
        ("followed-exec", |o| &mut o.followed_exec),
        ("no-optimize", |o| &mut o.no_optimize),
        ("verbose", |o| &mut o.verbose),
        ("full-vector-state", |o| &mut o.full_vector_state),
        ("stats", |o| &mut o.stats),
        ("lenient", |o| &mut o.lenient),
        ("raw-address", |o| &mut o.raw_address),
        ("call-graph", |o| &mut o.call_graph),
    ];

    /// Sets the option named `name` (as its record, or a configuration file, names it).
    pub fn set(&mut self, name: &str) -> Result<(), SpecError> {
        let (_, field) =
            Self::ALL.iter().find(|(n, _)| *n == name).ok_or_else(|| SpecError::UnknownOption(name.into()))?;
        *field(self) = true;
        Ok(())
    }

    /// The names of the options set, in record order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        let mut copy = *self;
        Self::ALL.iter().filter(move |(_, field)| *field(&mut copy)).map(|(name, _)| *name)
    }
}
