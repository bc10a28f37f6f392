//! Start-up: what was asked parsed, the run's definitions (and one return probe per function
//! of each `--latency`) resolved and registered by the trace layer with this folder's
//! handlers, checked and planned before any of their probes is placed, then the reports
//! started. A request that does not fit the events is one line naming the culprit, and exit
//! status 2, before the program's `main`.
//!
//! Context: start-up (before the program's constructors and `main`), normal context.

use core::sync::atomic::{AtomicBool, Ordering};

use crate::aggregate::hit;
use crate::aggregate::plan::{self, EventInfo};
use crate::aggregate::request::Request;
use crate::aggregate::{blocks, feed, report, timed};
use crate::base::spec::{Aggregate, Format};
use crate::probe::registry;
use crate::probe::stacks;
use crate::probe::table;
use crate::trace::def::{self, Kind, Place};
use crate::trace::events::{Event, Probe};
use crate::trace::setup::{self, Added, Frontend, Handlers, Settings};

/// The group of the events `--latency` makes (`latency/FUNCTION__return`).
const LATENCY_GROUP: &str = "latency";
/// How long start-up measures the time-stamp counter against the clock, with `--latency`.
const CALIBRATION_NS: u64 = 2_000_000;

struct Aggregator {
    request: Request,
}

impl Frontend for Aggregator {
    fn handlers(&self) -> Handlers {
        Handlers { entry: hit::on_entry, ret: hit::on_return, ret_entry: None, data_size: 0, vector_free: true }
    }

    fn added(&self) -> Vec<Added> {
        let head = format!("r:{LATENCY_GROUP}/ ");
        self.request
            .asked
            .latency
            .iter()
            .map(|place| Added {
                origin: "--latency".into(),
                text: format!("{head}{place}"),
                unwritten: head.len(),
                handlers: Handlers {
                    entry: hit::on_entry,
                    ret: hit::latency_return,
                    ret_entry: Some(hit::latency_entry),
                    data_size: hit::LATENCY_DATA,
                    vector_free: true,
                },
            })
            .collect()
    }

    fn prepare(&self, events: &'static [Event]) -> Result<(), String> {
        let infos: Vec<EventInfo> = events
            .iter()
            .map(|e| EventInfo {
                name: &e.name,
                group: &e.group,
                definition: &e.definition,
                kind: e.kind,
                args: &e.args,
                latency: timed(e),
                at_entry: at_entry(e),
            })
            .collect();
        let mut plans = plan::build(&infos, &self.request).map_err(|e| e.to_string())?;
        for (p, e) in plans.events.iter_mut().zip(events) {
            (p.filtered, p.gated) = (e.filter.is_some(), e.gated);
        }
        let names = plans.by.as_ref().is_some_and(|b| b.comm);
        blocks::init(&plans.layout, names).map_err(|e| {
            format!(
                "cannot reserve the counters of {} threads: {}",
                blocks::THREADS,
                std::io::Error::from_raw_os_error(e)
            )
        })?;
        hit::init_unblocked(events.len());
        hit::INTERVALS.store(plans.request.asked.interval_ns.is_some(), Ordering::Relaxed);
        if !plans.latencies.is_empty() {
            report::calibrate_start(CALIBRATION_NS);
            timed::enable();
        }
        if plans.layout.stack_words != 0 {
            stacks::enable();
        }
        plan::publish(plans);
        // Before any of the events' probes is placed: a count that is all its hit does is
        // made in the probe's stub where it can be.
        let hook: unsafe fn(*mut crate::base::abi::Uprobe) -> usize = hit::count_in_stub;
        table::INLINE_COUNT.store(hook as usize, Ordering::Release);
        Ok(())
    }
}

/// Whether `e` is a `--latency` event: only theirs are return probes with an entry handler.
fn timed(e: &Event) -> bool {
    match e.probe {
        // SAFETY: the probe objects are leaked, valid for the life of the process.
        Probe::Return(p) => unsafe { (*p).rp.entry_handler.is_some() },
        Probe::Entry(_) => false,
    }
}

/// Whether `e`'s probe is at a function's first instruction (a return event's caller is
/// known too): by its symbol where it is placed, by its definition where its module is not
/// loaded yet.
fn at_entry(e: &Event) -> bool {
    if e.kind == Kind::Return {
        return true;
    }
    if e.address() != 0 {
        return registry::symbolize(e.address()).is_some_and(|s| s.ends_with("+0x0"));
    }
    def::parse(&e.definition).is_ok_and(|d| matches!(d.place, Place::Symbol { offset: 0, .. }))
}

/// Starts aggregating the run's events instead of streaming them; false when there are none;
/// the line to refuse the run with (see `trace::setup::refuse_line`).
pub fn start(settings: &Settings, asked: &Aggregate, format: Option<Format>) -> Result<bool, String> {
    let request = Request::parse(asked, format).map_err(|e| e.to_string())?;
    if !setup::start_with(settings, Some(&Aggregator { request }))? {
        return Ok(false);
    }
    report::start(settings.followed_exec);
    if let Some(fd) = asked.feed {
        feed::start(fd);
    }
    extern "C" fn child() {
        blocks::after_fork();
        report::after_fork();
        feed::after_fork();
    }
    // Once per process (attach sessions aggregate again).
    static ONCE: AtomicBool = AtomicBool::new(false);
    if !ONCE.swap(true, Ordering::SeqCst) {
        // SAFETY: a plain function that stays loaded for the life of the process.
        unsafe { libc::pthread_atfork(None, None, Some(child)) };
    }
    Ok(true)
}
