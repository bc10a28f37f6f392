//! The list mode, `-l [PATTERN] [--] PROGRAM`: the program is started as a launch starts it,
//! and the runtime, seeing the `list` record, says what can be probed in it and the
//! libraries it loads, then ends it before its constructors run.
//!
//! Context: uprobe-run's own process, before the program starts.

use std::convert::Infallible;

use uprobe_contracts::spec::Spec;

use crate::base::error::Error;
use crate::launch::{self, Start};
use crate::plan::List;

/// Starts the listing; returns only with the reason it could not.
pub fn run(plan: List) -> Result<Infallible, Error> {
    let spec = Spec { list: Some(plan.pattern.unwrap_or_default()), ..Spec::default() };
    launch::start(Start {
        setup: &plan.setup,
        program: &plan.program,
        args: &plan.args,
        spec,
        has_work: true,
        serve: None,
    })
}
