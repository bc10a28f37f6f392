//! An attach session's events: its definitions streamed (`-e`, `--events`) or aggregated
//! (`--count`, `--hist`, `--lhist`, `--latency`), or a listing (`--list`), run by the same
//! front-ends as a launch's, from the spec the session delivers (`attach::session::Events`).
//! Their output is the session's socket: records, reports and the runtime's own lines go to
//! `uprobe-run`, never to the process's descriptors.
//!
//! Normal context, on the agent thread.

use crate::aggregate;
use crate::api::init;
use crate::attach::session::{Events, Started, EVENTS};
use crate::base::output::{self, Messages};
use crate::base::spec::Spec;
use crate::probe::deferred;
use crate::probe::table::Consumer;
use crate::trace;
use crate::trace::drain::Format;
use crate::trace::setup;

struct Attached;

static ATTACHED: Attached = Attached;

/// Makes the session's front-ends known to the attach layer (before its first session).
pub fn install() {
    let _ = EVENTS.set(&ATTACHED);
}

impl Events for Attached {
    fn start(&self, spec: &Spec, out: i32) -> Result<Started, String> {
        if let Some(pattern) = &spec.list {
            let pattern = Some(pattern.as_str()).filter(|p| !p.is_empty());
            return Ok(Started::Listed(deferred::inside(|| trace::list::list(pattern, out))));
        }
        let (settings, _) = init::settings(spec);
        // A Chrome trace is one JSON document: the runtime's lines go beside it, to
        // uprobe-run's stderr, as a launch writes them to the program's.
        if matches!(spec.format, Some(Format::Chrome | Format::Folded)) {
            output::set_messages(Messages::Aside);
        }
        let started = match spec.aggregate.any() {
            true => aggregate::setup::start(&settings, &spec.aggregate, spec.format),
            false => setup::start(&settings),
        };
        match started {
            Ok(true) => Ok(Started::Events),
            Ok(false) => Err("no definition to probe: give -e, --events or --latency".into()),
            Err(line) => Err(line),
        }
    }

    fn probes(&self) -> Vec<Consumer> {
        setup::consumers()
    }

    fn finish(&self) {
        trace::drain::finish();
        trace::drain::release();
        trace::filter::report();
        aggregate::report::finish();
        aggregate::feed::close();
        output::set_messages(Messages::Plain);
    }
}
